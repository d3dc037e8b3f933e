/* The one place the page's colours and shared words are written: the modes' colours (lines and fills) and their
 * text shades, the colours of other tools' series, and what "busy" is called for each way it was measured.
 * Every chart (the live scope, the Sweep tab's figures) reads them from here, and the stylesheet reads the modes'
 * colours as custom properties this module sets on :root (--bs-sync, --bs-sync-ink, --bs-async, --bs-async-ink),
 * so no colour is written twice. */

// Lines and fills. As text on white they read too light: MODE_INK below keeps 4.5:1.
export const MODE_COLOR = { sync: "#ea580c", async: "#2563eb" };
export const MODE_INK = { sync: "#c2410c", async: "#1d4ed8" };
// Series of other tools' reports (GuideLLM, vllm bench serve, another batchscope) overlaid on ours, in turn.
export const FOREIGN_COLORS = ["#059669", "#7c3aed", "#6b7280", "#b45309", "#db2777"];
export const OTHER = "#111827";              // a series of ours that is neither mode

export const modeColor = mode => MODE_COLOR[mode] || OTHER;

// How busy % was measured, in the records' words (summary.busy_basis, a result's telemetry.busy_basis).
const BUSY_LABEL = { events: "busy (events)", host: "busy (host)", device_ops: "busy (device ops)" };

export function busyLabel(basis) {
  return BUSY_LABEL[basis] || BUSY_LABEL.events;
}

function setCssColours() {
  const root = document.documentElement.style;
  for (const [mode, c] of Object.entries(MODE_COLOR)) root.setProperty("--bs-" + mode, c);
  for (const [mode, c] of Object.entries(MODE_INK)) root.setProperty("--bs-" + mode + "-ink", c);
}

if (typeof document !== "undefined") setCssColours();
