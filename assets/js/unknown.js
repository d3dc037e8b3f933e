/* What an imported trace does not hold: meta.source.unknown lists those fields (request counts, tokens, KV,
 * queue; telemetry/importers), and the page shows them as NOT_IN_TRACE, never as 0. Empty for batchscope's own
 * recordings. */
export const NOT_IN_TRACE = "–, not in the trace";

export function notInTrace(d) {
  const src = d && d.meta && d.meta.source;
  return new Set(src && Array.isArray(src.unknown) ? src.unknown : []);
}
