/* Small DOM and formatting helpers shared by every part of the page. */

export function $(id) { return document.getElementById(id); }

// Writes only on change: the header is updated several times a second and most values stay the same.
export function setText(id, text) {
  const el = $(id);
  if (el && el.textContent !== text) el.textContent = text;
}

export function fmt(v, digits) {
  if (v === undefined || v === null || Number.isNaN(v)) return "–";
  return Number(v).toFixed(digits === undefined ? 0 : digits);
}

export function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// A short message in the toolbar; errors stay longer than confirmations.
export function note(text, isError) {
  const el = $("bs-msg");
  if (!el) return;
  el.textContent = text;
  el.className = "bs-msg " + (isError ? "bs-error" : "bs-ok");
  clearTimeout(note.timer);
  note.timer = setTimeout(() => { el.textContent = ""; el.className = "bs-msg"; }, isError ? 12000 : 5000);
}
