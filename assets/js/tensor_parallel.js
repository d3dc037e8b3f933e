/* Tensor parallelism as the data tells it: the ranks beside rank 0 and their devices, and the all-reduce time of
 * a step estimated from what the engine measured at start-up. */

const sizeOf = info => (info && Number.isInteger(info.tensor_parallel_size) ? info.tensor_parallel_size : 1);

// What the data says about tensor parallelism: the ranks beside rank 0 (from the engine's info, and from the
// rank step records themselves, for a recording made without the info), their devices, and the all-reduce
// figures the engine measured at start-up. {size: 1, ranks: []} for a single-rank engine.
export function tensorParallel(d) {
  const meta = d.meta || {};
  const info = meta.info || {};
  const byRank = d.rankSteps || {};
  const seen = Object.keys(byRank).map(Number).filter(r => r >= 1 && byRank[r].length);
  const size = Math.max(sizeOf(info), seen.length ? Math.max(...seen) + 1 : 1);
  const infoRanks = Array.isArray(info.ranks) ? info.ranks : [];
  const rank0Device = (infoRanks[0] && infoRanks[0].device) || meta.device || "";
  const ranks = [];
  for (let rank = 1; rank < size; rank++) {
    const arr = byRank[rank] || [];
    const fromInfo = infoRanks.find(x => x && x.rank === rank);
    const last = arr[arr.length - 1];
    const device = String((fromInfo && fromInfo.device) || (last && last.device) || (rank0Device.startsWith("cpu") ? "cpu" : ""));
    // On the CPU a rank has no streams: its "compute" is the launch span the forward ran inside (as rank 0's
    // host compute). With no device known, whether its records carry copies decides.
    const host = device.startsWith("cpu") || (!device && !!last && !!last.gpu && !last.gpu.h2d && !last.gpu.d2h);
    // (an imported trace knows each rank's idle time by cause: it gets a GPU idle lane as rank 0's)
    const phases = host ? ["compute"] : ["h2d", "compute", "d2h"];
    ranks.push({ rank, device, host, phases: meta.source && !host ? phases.concat("idle") : phases });
  }
  const measured = info.allreduce_us && typeof info.allreduce_us === "object" ? info.allreduce_us : {};
  const rows = Object.keys(measured).map(Number).filter(k => isFinite(k) && k > 0 && isFinite(measured[k])).sort((a, b) => a - b);
  return { size, ranks, rank0Device, perStep: Number(info.allreduces_per_step) || 0, measured, rows };
}

// The rows a step all-reduces: its tokens ([tokens, hidden] after attention and after the MLP of each layer).
export function stepRows(s) {
  const t = (s.prefill_tokens || 0) + (s.decode_tokens || 0);
  return t > 0 ? t : (s.num_requests || 1);
}

// Estimated all-reduce time of a step of `rows` rows, µs: allreduces_per_step times one all-reduce of the
// smallest measured size that holds the rows (past the largest, scaled up from it). null when unknown.
export function allreduceEstimate(tp, rows) {
  if (!tp || !tp.perStep || !tp.rows.length) return null;
  const k = tp.rows.find(x => x >= rows);
  const top = tp.rows[tp.rows.length - 1];
  const one = k !== undefined ? tp.measured[k] : tp.measured[top] * rows / top;
  return { us: tp.perStep * one, one, rows: k !== undefined ? k : rows, count: tp.perStep, scaled: k === undefined };
}
