/* The rank table under the scoreboard, for an imported trace of several ranks (telemetry/importers/headline.py):
 * each rank's device busy (the union of its ops), its collective time, how long its host kept the device waiting,
 * and its idle time by cause; then the rank that held the others back, named with the evidence (its host
 * launched late while the others waited inside the collectives), or why no rank stands out. The server computed
 * every figure; this only lays them out. */
import { causeLabel } from "./names.js";
import { esc, fmt } from "./util.js";

const CAUSES_SHOWN = 3;
const ms = us => (us === null || us === undefined ? "–" : (us / 1000).toFixed(2) + " ms");
const HEAD = [
  ["device busy", "share of the steps' window this rank's device ran any op (kernels, copies, memsets, all streams)"],
  ["collectives", "time in collective (NCCL/RCCL) kernels: busy, but waiting for the other ranks there"],
  ["host late", "idle time this rank's host was late for: the device waited for a launch"],
  ["idle by cause", "the device's idle time between and inside steps, the largest causes first"],
];

export function rankTableHtml(d) {
  const sm = (d && d.summary) || {};
  const ranks = Array.isArray(sm.ranks) ? sm.ranks : [];
  if (ranks.length < 2 || !ranks.every(r => r.busy_basis === "device_ops")) return "";
  const st = sm.straggler || {};
  const named = st.rank !== null && st.rank !== undefined;
  const rows = ranks.map(r => {
    const causes = Object.entries(r.idle_us_by_cause || {}).sort((a, b) => b[1] - a[1]).slice(0, CAUSES_SHOWN)
      .map(([c, us]) => `${esc(causeLabel(c))} ${ms(us)}`).join(", ");
    const slow = named && st.rank === r.rank;
    return `<tr data-rank="${r.rank}" data-busy="${r.busy_pct}"${slow ? ' class="bs-straggler"' : ""}>` +
      `<th scope="row">rank ${r.rank}${slow ? " <small>straggler</small>" : ""}</th>` +
      `<td>${fmt(r.busy_pct, 1)}%</td><td>${ms(r.collective_us)}</td><td>${ms(r.host_late_us)}</td>` +
      `<td>${ms((r.idle_between_us || 0) + (r.idle_inside_us || 0))}${causes ? ` <small>${causes}</small>` : ""}</td></tr>`;
  }).join("");
  const verdict = named ? `<b>rank ${st.rank} held the others back</b>: ${esc(st.evidence || "")}` : esc(st.reason || "");
  return `<div class="bs-ranks" id="bs-ranks" data-straggler="${named ? st.rank : ""}">` +
    `<table class="bs-rank-table"><thead><tr><th scope="col">ranks</th>` +
    HEAD.map(([h, title]) => `<th scope="col" title="${esc(title)}">${h}</th>`).join("") +
    `</tr></thead><tbody>${rows}</tbody></table><div class="bs-straggler-line">${verdict}</div></div>`;
}
