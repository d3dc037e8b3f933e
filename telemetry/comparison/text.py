"""A `batchscope.compare/1` result for people: terminal lines and Markdown (a pull request's comment)."""
from __future__ import annotations

TOP_BUCKETS = 8
INCONCLUSIVE_BECAUSE = {
    "coverage": "the matched steps hold too little of the run's time",
    "machine_speed": "the machine's own speed moved with the step time",
    "interval": "the interval reaches past the minimum effect on one side and not the other"}
FIGURE_NAMES = {"step": "device step time", "compute": "compute span", "idle": "idle before the step",
                "idle_inside": "idle inside the step"}


def figure_name(name: str) -> str:
    if name.startswith("host."):
        return f"host {name[5:]}"
    if name.startswith("cause."):
        return f"idle: {name[6:]}"
    return FIGURE_NAMES.get(name, name)


def _ratio(r: dict) -> str:
    if r.get("value") is None:
        return "unknown"
    interval = f" [{r['low']:.3f}-{r['high']:.3f}]" if r.get("low") is not None else ""
    return f"{r['value']:.3f}x{interval}"


def _delta(d: dict) -> str:
    if d.get("value") is None:
        return "unknown"
    interval = f" [{d['low']:+.3f}, {d['high']:+.3f}]" if d.get("low") is not None else ""
    return f"{d['value']:+.3f} ms{interval}"


def headline(result: dict) -> str:
    step = result["figures"]["step"]
    verdict, ratio = result["verdict"], step["ratio"]["value"]
    if verdict in ("slower", "faster") and ratio is not None:
        said = f"NEW is {verdict} by {abs(ratio - 1) * 100:.1f}%"
    elif verdict == "same":
        said = f"same (within the minimum effect of {result['noise']['min_effect'] * 100:.0f}%)"
    else:
        said = "inconclusive (" + INCONCLUSIVE_BECAUSE.get(result.get("verdict_reason"), "") + ")"
    return (f"verdict: {said}: device step time NEW/BASE {_ratio(step['ratio'])} "
            f"({step['base_ms']:.3f} -> {step['new_ms']:.3f} ms per step over the common mix of shapes)")


def _noise_line(result: dict) -> str:
    nz = result["noise"]
    return (f"noise: {int(nz['level'] * 100)}% intervals from a block bootstrap over steps"
            + (" and the spread between recordings" if nz["run_spread"] else "")
            + f"; minimum effect {nz['min_effect'] * 100:.0f}% ({nz['min_effect_source']})")


def text_lines(result: dict) -> list[str]:
    lines = [f"warning: {w}" for w in result["warnings"]]
    base, new = result["base"], result["new"]
    for label, side in (("BASE:", base), ("NEW: ", new)):
        lines.append(f"{label} {_names(side['recordings'])} ({side['matched_steps']} of {side['timed_steps']} timed "
                     f"steps matched)")
    if result["settings_changed"]:
        lines.append("settings changed: " + ", ".join(f"{k} {v[0]} -> {v[1]}"
                                                       for k, v in result["settings_changed"].items()))
    if not result["matching"]["mode_in_key"]:
        lines.append(f"mode: {'/'.join(base['modes'])} -> {'/'.join(new['modes'])} (the change compared; steps "
                     f"matched by shape alone)")
    lines += [headline(result), _noise_line(result), "figures (per step, NEW/BASE, NEW-BASE):"]
    for name, fig in result["figures"].items():
        lines.append(f"  {figure_name(name):<26} {fig['base_ms']:>9.3f} -> {fig['new_ms']:>9.3f} ms  "
                     f"{_ratio(fig['ratio']):<26} {_delta(fig['delta_ms']):<32} {fig['verdict']}")
    lines += _moved_lines(result)
    lines += _bucket_lines(result)
    lines += _unmatched_lines(result)
    lines += _e2e_lines(result)
    return lines


def _names(recordings: list[str]) -> str:
    if len(recordings) <= 2:
        return ", ".join(recordings)
    return f"{len(recordings)} recordings: {recordings[0]} ... {recordings[-1]}"


def _moved_lines(result: dict) -> list[str]:
    if not result["moved"]:
        return ["where the time moved: no part of the step moved beyond the minimum effect"]
    out = ["where the time moved:"]
    for m in result["moved"]:
        out.append(f"  {figure_name(m['figure'])}: {'grew' if m['grew'] else 'shrank'} {_delta(m['delta_ms'])} "
                   f"per step")
    return out


def _bucket_lines(result: dict) -> list[str]:
    buckets = sorted(result["buckets"], key=lambda b: -(b["time_share"] or 0))
    out = [f"matched shapes: {len(buckets)} (largest {min(TOP_BUCKETS, len(buckets))} by time share):"]
    for b in buckets[:TOP_BUCKETS]:
        out.append(f"  {b['label']:<44} {b['base_steps']:>5}/{b['new_steps']:<5} steps {100 * b['time_share']:5.1f}%"
                   f"  {b['base_step_ms']:.3f} -> {b['new_step_ms']:.3f} ms  {_ratio(b['ratio'])}  {b['verdict']}")
    return out


def _unmatched_lines(result: dict) -> list[str]:
    u = result["unmatched"]
    parts = []
    for key, what in (("base_only", "only BASE ran"), ("new_only", "only NEW ran"),
                      ("too_few_steps", "too few steps")):
        if u[key]:
            parts.append(f"{len(u[key])} shapes {what}")
    if not parts:
        return ["not matched: nothing (every timed step was compared)"]
    base, new = (100 * (u[f"{side}_time_share"] or 0) for side in ("base", "new"))
    return [f"not matched: {', '.join(parts)}; their share of step time: BASE {base:.1f}%, NEW {new:.1f}%"]


def _e2e_lines(result: dict) -> list[str]:
    e2e = {k: v for k, v in result["end_to_end"].items() if k != "note"}
    if not e2e:
        return ["end to end: not in both recordings"]
    out = ["end to end (depends on the batch mix; no verdict):"]
    for name, v in e2e.items():
        ratio = f"{v['ratio']:.3f}x" if v["ratio"] is not None else "-"
        out.append(f"  {name:<28} {v['base']:>10.3f} -> {v['new']:>10.3f}  {ratio}")
    return out


def markdown(result: dict) -> str:
    """A short Markdown report: the verdict, the figures table, what moved, the top shapes, what was not matched."""
    lines = [f"> **warning:** {w}" for w in result["warnings"]]
    if lines:
        lines.append("")
    lines += [f"### batchscope compare: **{result['verdict']}**", "", headline(result).replace("verdict: ", ""), "",
              _noise_line(result), ""]
    if result["settings_changed"]:
        lines += ["Settings changed: " + ", ".join(f"`{k}` {v[0]} → {v[1]}"
                                                    for k, v in result["settings_changed"].items()), ""]
    lines += ["| figure (ms per step) | BASE | NEW | NEW/BASE | 90% interval | verdict |",
              "|---|---:|---:|---:|---|---|"]
    for name, fig in result["figures"].items():
        r = fig["ratio"]
        interval = f"{r['low']:.3f}–{r['high']:.3f}" if r.get("low") is not None else "–"
        value = f"{r['value']:.3f}" if r.get("value") is not None else "–"
        lines.append(f"| {figure_name(name)} | {fig['base_ms']:.3f} | {fig['new_ms']:.3f} | {value} | {interval} | "
                     f"{fig['verdict']} |")
    moved = _moved_lines(result)
    lines += ["", moved[0]] + ([""] + [f"- {x.strip()}" for x in moved[1:]] if len(moved) > 1 else [])
    lines += ["", "| shape | steps BASE/NEW | time share | BASE ms | NEW ms | NEW/BASE | verdict |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for b in sorted(result["buckets"], key=lambda b: -(b["time_share"] or 0))[:TOP_BUCKETS]:
        lines.append(f"| {b['label']} | {b['base_steps']}/{b['new_steps']} | {100 * b['time_share']:.1f}% | "
                     f"{b['base_step_ms']:.3f} | {b['new_step_ms']:.3f} | {_ratio(b['ratio'])} | {b['verdict']} |")
    lines += ["", _unmatched_lines(result)[0], "", f"_{result['end_to_end']['note']}_", ""]
    return "\n".join(lines)
