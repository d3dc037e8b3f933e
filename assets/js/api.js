/* Talking to the server: JSON over HTTP and the telemetry websocket, both carrying the page's token (when the
 * server was started with one, the page was opened as /?token=...). */

const TOKEN = new URLSearchParams(location.search).get("token");
const DEFAULT_TIMEOUT_MS = 15000;

export function withToken(path) {
  if (!TOKEN) return path;
  return path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(TOKEN);
}

// Every refusal from /api carries {"error": reason} (app/server/errors.py); anything else is a transport failure.
function errorText(body, res) {
  if (body && body.error) return String(body.error);
  return res.status + " " + (res.statusText || "error");
}

// Every call has a timeout so that a stuck server shows an error instead of a spinner forever. A Blob (a chosen
// file) is sent as its bytes, as it is: a gzipped trace must reach the server unchanged.
export async function api(path, method, body, timeoutMs) {
  const headers = {};
  const bytes = body instanceof Blob;
  if (body !== undefined) headers["Content-Type"] = bytes ? "application/octet-stream" : "application/json";
  if (TOKEN) headers["Authorization"] = "Bearer " + TOKEN;
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs || DEFAULT_TIMEOUT_MS);
  try {
    const res = await fetch(withToken(path), {
      method: method || "GET", headers, signal: ctl.signal,
      body: body === undefined ? undefined : (typeof body === "string" || bytes ? body : JSON.stringify(body)),
    });
    let json = null;
    try { json = await res.json(); } catch (e) { /* not JSON */ }
    if (!res.ok) throw new Error(errorText(json, res));
    return json;
  } catch (e) {
    if (e.name === "AbortError") throw new Error(path + ": no answer within " + Math.round((timeoutMs || DEFAULT_TIMEOUT_MS) / 1000) + " s");
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

// The telemetry websocket. `open` says whether messages are flowing (the clock extrapolates only then).
export const socket = { ws: null, open: false, backoff: 500 };

// Connects and reconnects with a growing backoff for as long as `wanted()` holds. Each parsed message goes to
// onMessage; onState hears "connecting", "live", "reconnecting" or "error" for the connection badge.
export function connect(onMessage, onState, wanted) {
  if (wanted && !wanted()) return;
  const again = () => connect(onMessage, onState, wanted);
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + withToken("/ws/telemetry");
  onState("connecting");
  try { socket.ws = new WebSocket(url); } catch (e) { onState("error"); setTimeout(again, socket.backoff); return; }
  socket.ws.onopen = () => { socket.open = true; socket.backoff = 500; onState("live"); };
  socket.ws.onmessage = ev => {
    let m;
    try { m = JSON.parse(ev.data); } catch (e) { return; }
    onMessage(m);
  };
  socket.ws.onclose = () => {
    socket.open = false;
    onState("reconnecting");
    setTimeout(again, socket.backoff);
    socket.backoff = Math.min(socket.backoff * 2, 8000);
  };
}
