//! `cni-ebpf observe --ui`: the live map of who talks to whom, served on this machine
//! (`--ui-listen`, the loopback by default) from the agents `observe` reads, with the
//! token it holds — the browser never sees the token. The page is part of the binary
//! (no build step, nothing fetched from elsewhere): [`PAGE`].
//!
//! - `GET /`: the page. It asks for the flows of the last five minutes, then every
//!   second for what is new, and draws each workload, Service, node and "world" as a box
//!   and the flows between two of them as an edge: flows a minute on its label, red and
//!   dashed while its latest drop is newer than its latest flow that was answered. A
//!   click on an edge lists its recent flows with what decided them (rule set,
//!   policies, the cluster policy rule).
//! - `GET /flows?<filter>`: the agents' answers merged (what `observe` prints).

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header::{self, HeaderValue},
    service::service_fn,
    Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;

use super::Readers;
use crate::{
    agent::{
        flows::{serve::now_unix_nano, window::Filter},
        http::bounded_http1,
    },
    error::{Error, Result},
};

/// Serves the page and its data on `listen` until the process is stopped.
///
/// # Errors
/// The listener cannot be bound.
pub async fn serve(listen: SocketAddr, readers: Readers) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::io(format!("listening on {listen}"), e))?;
    eprintln!("cni-ebpf observe: the live map is on http://{listen}/");
    let readers = Arc::new(readers);
    let http = bounded_http1();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let readers = Arc::clone(&readers);
        let service = service_fn(move |req| answer(Arc::clone(&readers), req));
        let conn = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), conn).await;
        });
    }
}

async fn answer(
    readers: Arc<Readers>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, ty: &'static str, body: Bytes| {
        let mut r = Response::new(Full::new(body));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ty));
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    };
    Ok(match req.uri().path() {
        "/" => reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            Bytes::from_static(PAGE.as_bytes()),
        ),
        "/flows" => match Filter::from_query(req.uri().query().unwrap_or(""), now_unix_nano()) {
            Ok((filter, _)) => {
                let (flows, _) = readers.query(&filter).await;
                reply(
                    StatusCode::OK,
                    "application/json",
                    Bytes::from(serde_json::to_vec(&flows).unwrap_or_default()),
                )
            }
            Err(e) => reply(
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8",
                Bytes::from(e),
            ),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"not found\n"),
        ),
    })
}

/// The page: HTML, CSS and script in one, drawn as SVG.
pub const PAGE: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<title>cni-ebpf — who talks to whom</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 0; display: flex; height: 100vh; color: #1d2430; }
  #map { flex: 1; }
  #side { width: 380px; border-left: 1px solid #d0d7e2; padding: 12px; overflow: auto; background: #f7f9fc; }
  h1 { font-size: 16px; margin: 0 0 8px; }
  #status { color: #566; margin-bottom: 10px; }
  #errors { color: #b00020; white-space: pre-wrap; }
  .box rect { fill: #fff; stroke: #3a6ea5; stroke-width: 1.5; rx: 6; }
  .box.world rect { stroke: #777; stroke-dasharray: 4 3; }
  .box.service rect { stroke: #7a4fb0; }
  .box text { font-size: 12px; text-anchor: middle; dominant-baseline: middle; }
  .edge line { stroke: #3a8a4a; stroke-width: 2; marker-end: url(#arrow); }
  .edge.refused line { stroke: #c62828; stroke-dasharray: 6 4; marker-end: url(#arrow-refused); }
  .edge text { font-size: 11px; fill: #333; }
  .edge { cursor: pointer; }
  .edge.selected line { stroke-width: 4; }
  table { border-collapse: collapse; width: 100%; font-size: 12px; }
  td, th { border-bottom: 1px solid #e0e4ea; padding: 3px 4px; text-align: left; vertical-align: top; }
  .dropped { color: #c62828; }
</style>
</head>
<body>
<svg id="map" xmlns="http://www.w3.org/2000/svg">
  <defs>
    <marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#3a8a4a"/></marker>
    <marker id="arrow-refused" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#c62828"/></marker>
  </defs>
  <g id="edges"></g><g id="boxes"></g>
</svg>
<div id="side">
  <h1>cni-ebpf flows</h1>
  <div id="status">loading…</div>
  <div id="errors"></div>
  <div id="detail">Click an edge to list its recent flows.</div>
</div>
<script>
"use strict";
const KEEP = 5000, RECENT = 50, RATE_WINDOW_NS = 60e9;
const flows = [];
const edges = new Map();
const seen = new Set();
let since = "5m", selected = null;
window.onerror = (msg) => { document.getElementById("errors").textContent += msg + "\n"; };
window.onunhandledrejection = (e) => { document.getElementById("errors").textContent += String(e.reason) + "\n"; };

function group(ep) {
  if (ep.kind === "pod" && ep.namespace && ep.workload) return ep.namespace + "/" + ep.workload;
  if (ep.kind === "service") return ep.namespace + "/Service/" + ep.name;
  if (ep.kind === "world") return "world";
  if (ep.kind === "node") return "node/" + ep.name;
  return ep.namespace ? ep.namespace + "/" + ep.name : ep.ip;
}
function kindOf(ep) { return ep.kind === "world" ? "world" : ep.kind; }

function add(f) {
  const id = [f.timeUnixNano, f.node, f.network, f.kind, f.direction, f.source.ip, f.source.port, f.destination.ip, f.destination.port].join("|");
  if (seen.has(id)) return;
  seen.add(id);
  flows.push(f);
  // A flow the socket hooks sent to a Service's backend is drawn to its Service, as
  // under kube-proxy.
  const dest = f.service || f.destination;
  const from = group(f.source), to = group(dest);
  const key = from + "\u2192" + to;
  let e = edges.get(key);
  if (!e) { e = { from, to, fromKind: kindOf(f.source), toKind: kindOf(dest), recent: [], times: [] }; edges.set(key, e); }
  e.recent.push(f);
  if (e.recent.length > RECENT) e.recent.shift();
  if (f.kind !== "end") e.times.push(f.timeUnixNano);
  // Refused: a drop newer than the last flow that got an answer back.
  if (f.verdict === "dropped") e.lastDrop = Math.max(e.lastDrop || 0, f.timeUnixNano);
  if (f.kind === "end" && f.counters.packetsToSource > 0) e.lastAnswered = Math.max(e.lastAnswered || 0, f.timeUnixNano);
}

function draw() {
  const svg = document.getElementById("map");
  const W = svg.clientWidth || 900, H = svg.clientHeight || 700;
  const names = new Map();
  for (const e of edges.values()) { names.set(e.from, e.fromKind); names.set(e.to, e.toKind); }
  const sorted = [...names.keys()].sort();
  const pos = new Map();
  const r = Math.min(W, H) / 2 - 90;
  sorted.forEach((n, i) => {
    const a = 2 * Math.PI * i / Math.max(sorted.length, 1) - Math.PI / 2;
    pos.set(n, [W / 2 + r * Math.cos(a), H / 2 + r * Math.sin(a)]);
  });
  const now = Math.max(0, ...flows.map(f => f.timeUnixNano));
  const ns = "http://www.w3.org/2000/svg";
  const boxes = document.getElementById("boxes"), lines = document.getElementById("edges");
  boxes.replaceChildren(); lines.replaceChildren();
  for (const n of sorted) {
    const [x, y] = pos.get(n);
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", "box " + names.get(n));
    g.dataset.name = n;
    const w = Math.max(90, n.length * 7 + 16);
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", x - w / 2); rect.setAttribute("y", y - 16);
    rect.setAttribute("width", w); rect.setAttribute("height", 32);
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.textContent = n;
    g.append(rect, t); boxes.append(g);
  }
  for (const [key, e] of edges) {
    const [x1, y1] = pos.get(e.from), [x2, y2] = pos.get(e.to);
    const dx = x2 - x1, dy = y2 - y1, d = Math.hypot(dx, dy) || 1;
    const refused = (e.lastDrop || 0) > (e.lastAnswered || 0);
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", "edge" + (refused ? " refused" : "") + (selected === key ? " selected" : ""));
    g.dataset.from = e.from; g.dataset.to = e.to; g.dataset.state = refused ? "refused" : "forwarded";
    const line = document.createElementNS(ns, "line");
    line.setAttribute("x1", x1 + dx / d * 50); line.setAttribute("y1", y1 + dy / d * 20);
    line.setAttribute("x2", x2 - dx / d * 50); line.setAttribute("y2", y2 - dy / d * 20);
    const perMinute = e.times.filter(t => now - t < RATE_WINDOW_NS).length;
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", (x1 + x2) / 2 + 6); label.setAttribute("y", (y1 + y2) / 2 - 6);
    label.textContent = perMinute + "/min" + (refused ? " refused" : "");
    g.append(line, label);
    g.addEventListener("click", () => { selected = key; detail(); draw(); });
    lines.append(g);
  }
  document.getElementById("status").textContent =
    flows.length + " flows, " + edges.size + " edges, updated " + new Date().toLocaleTimeString();
}

function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.append(td); }
function decided(f) {
  if (!f.policy) return f.reason || "";
  const parts = [];
  for (const side of ["egress", "ingress"]) {
    const s = f.policy[side];
    if (!s) continue;
    parts.push(side + ": " + s.ruleset + (s.policies && s.policies.length ? " (" + s.policies.join(", ") + ")" : "") + (s.decidedBy ? " " + s.decidedBy : ""));
  }
  return (f.reason ? f.reason + "; " : "") + parts.join("; ");
}
function detail() {
  const e = edges.get(selected);
  const box = document.getElementById("detail");
  if (!e) return;
  const h = document.createElement("h1"); h.textContent = e.from + " \u2192 " + e.to;
  const table = document.createElement("table"); table.id = "edge-flows";
  const head = document.createElement("tr");
  for (const c of ["time", "kind", "port", "backend", "decided by"]) { const th = document.createElement("th"); th.textContent = c; head.append(th); }
  table.append(head);
  for (const f of [...e.recent].reverse()) {
    const tr = document.createElement("tr");
    cell(tr, f.time.slice(11, 23));
    cell(tr, f.kind, f.verdict === "dropped" ? "dropped" : "");
    cell(tr, f.protocol + "/" + (f.service || f.destination).port);
    // The pod a Service's flow went to, when the node chose it.
    cell(tr, f.service ? (f.destination.name || f.destination.ip) + ":" + f.destination.port : "");
    cell(tr, decided(f));
    table.append(tr);
  }
  box.replaceChildren(h, table);
}

async function poll() {
  try {
    const r = await fetch("flows?since=" + encodeURIComponent(since));
    if (!r.ok) throw new Error("flows: " + r.status + " " + await r.text());
    const got = await r.json();
    for (const f of got) add(f);
    if (got.length) since = got[got.length - 1].time;
    while (flows.length > KEEP) flows.shift();
    if (seen.size > 4 * KEEP) seen.clear();
    draw();
    if (selected) detail();
  } catch (err) {
    document.getElementById("errors").textContent = String(err) + "\n";
  }
  setTimeout(poll, 1000);
}
poll();
</script>
</body>
</html>
"##;
