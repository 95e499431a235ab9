// plugrad viz page: talks to /api/* (plugrad/viz/server.py); no external resources.
"use strict";
const $ = (id) => document.getElementById(id);
const KIND_BADGE = { kernel: "K", schedule: "S", symbolic: "Sym", rewrite: "R" };
const state = { groups: [], group: null, rewrite: null, step: 0, steps: 0, profile: null, full: null, view: null };

// body[data-busy] is "1" while requests are in flight (the page settles before it reads "0" again: tests wait on it)
function busy(d) { state.pending = (state.pending || 0) + d; document.body.dataset.busy = state.pending ? "1" : "0"; }

async function api(path) {
  busy(1);
  try {
    const r = await fetch(path);
    const j = await r.json();
    if (!r.ok) throw new Error(j.error || r.statusText);
    return j;
  } finally { busy(-1); }
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function setStatus(s) { $("status").textContent = s; }
function fail(e) { setStatus(`error: ${e.message}`); }

function renderGroups() {
  const f = $("filter").value.toLowerCase(), onlyK = $("only-kernels").checked;
  const ul = $("groups");
  ul.replaceChildren();
  for (const g of state.groups) {
    if (onlyK && g.kind !== "kernel") continue;
    if (f && !g.name.toLowerCase().includes(f)) continue;
    const li = el("li", { class: `group kind-${g.kind}` + (state.group && state.group.id === g.id ? " selected" : ""), "data-gid": g.id,
                          title: `${g.kind}: ${g.name} (${g.rewrites} rewrites, ${g.steps} steps)`, onclick: () => selectGroup(g.id).catch(fail) },
                  el("span", { class: "kind" }, KIND_BADGE[g.kind] || "R"),
                  el("span", { class: "gname" }, g.name),
                  el("span", { class: g.kind === "kernel" ? "dev" : "count" }, g.kind === "kernel" ? g.device : `${g.steps} steps`));
    ul.append(li);
  }
}

async function selectGroup(gid) {
  const g = await api(`/api/group/${gid}`);
  state.group = g;
  renderGroups();
  $("group-title").textContent = g.kernel ? `kernel ${g.kernel.name} on ${g.kernel.device}` : `${g.kind}: ${g.name}`;
  const k = g.kernel;
  $("kernel-panes").hidden = !k;
  if (k) {
    $("k-ast").textContent = k.ast_text;
    $("k-opts").textContent = k.opts.length ? k.opts.join("\n") : "(none)";
    $("k-linear").textContent = k.linear;
    $("k-src").textContent = k.src;
  }
  renderRewrites();
  const first = g.rewrites.find((r) => r.steps > 0 && !r.schedule) || g.rewrites.find((r) => r.steps > 0);
  if (first) await selectRewrite(first.id, 0);
  else if (k) await showAst(gid);
  else { state.rewrite = null; $("graph").replaceChildren(); updateStepper(); }
}

function renderRewrites() {
  const g = state.group, ul = $("rewrites"), all = $("show-empty").checked;
  ul.replaceChildren();
  if (g.kernel) ul.append(el("li", { class: "rewrite ast" + (state.rewrite === "ast" ? " selected" : ""), onclick: () => showAst(g.id).catch(fail) }, "kernel AST"));
  for (const r of g.rewrites) {
    if (!all && r.steps === 0) continue;
    ul.append(el("li", { class: "rewrite" + (r.schedule ? " from-schedule" : "") + (state.rewrite === r.id ? " selected" : ""), "data-rid": r.id,
                         title: r.schedule ? "run by the scheduler while building this kernel's AST" : "run by this context",
                         onclick: () => selectRewrite(r.id, 0).catch(fail) },
                 el("span", {}, (r.schedule ? "schedule: " : "") + r.name), el("span", { class: "count" }, `${r.steps}${r.truncated ? "+" : ""} steps`)));
  }
}

function showSvg(svg) {
  const box = $("graph");
  box.innerHTML = svg;
  const hot = box.querySelector('g.node [stroke="#d93025"]');  // bring the nodes the step created into view
  if (hot) {
    const r = hot.getBoundingClientRect(), b = box.getBoundingClientRect();
    box.scrollTop += r.top - b.top - b.height / 2;
    box.scrollLeft += r.left - b.left - b.width / 2;
  }
}

async function showAst(gid) {
  const a = await api(`/api/kernel/${gid}/ast`);
  state.rewrite = "ast"; state.step = 0; state.steps = 0;
  showSvg(a.svg);
  $("rule").textContent = "the kernel's AST as scheduling built it (codegen's input)";
  $("graph-info").textContent = `${a.nodes} nodes` + (a.drawn < a.nodes ? `, ${a.drawn} drawn` : "");
  renderRewrites(); updateStepper();
}

async function selectRewrite(rid, k) {
  setStatus("drawing...");
  const r = await api(`/api/rewrite/${rid}/${k}`);
  state.rewrite = rid; state.step = r.step; state.steps = r.steps;
  showSvg(r.svg);
  $("rule").textContent = r.rule ? `${r.rule.name}  ${r.rule.where}\n${r.rule.code}\n${r.rule.before}\n  -> ${r.rule.after}`
                                 : `${r.name}: input graph (${r.steps} steps)`;
  $("graph-info").textContent = `${r.nodes} nodes` + (r.drawn < r.nodes ? `, ${r.drawn} drawn` : "") + (r.step ? `, ${r.changed} new` : "") +
                                (r.truncated ? " (steps truncated)" : "");
  renderRewrites(); updateStepper(); setStatus("");
}

function updateStepper() {
  const on = typeof state.rewrite === "number";
  $("step-label").textContent = on ? `step ${state.step} / ${state.steps}` : "-";
  $("prev").disabled = !on || state.step <= 0;
  $("next").disabled = !on || state.step >= state.steps;
}

function step(d) {
  if (typeof state.rewrite !== "number") return;
  const k = state.step + d;
  if (k >= 0 && k <= state.steps) selectRewrite(state.rewrite, k).catch(fail);
}

// ***** timeline *****
function fmtBytes(b) { return b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(1)} MiB` : b >= 1024 ? `${(b / 1024).toFixed(1)} KiB` : `${b} B`; }
function fmtUs(us) { return us >= 1000 ? `${(us / 1000).toFixed(2)} ms` : `${us.toFixed(1)} us`; }

async function showTimeline() {
  if (!state.profile) state.profile = await api("/api/profile");
  const evs = state.profile.traceEvents || [];
  const procs = {}, threads = {};
  for (const e of evs) if (e.ph === "M" && e.name === "process_name") procs[e.pid] = e.args.name;
  for (const e of evs) if (e.ph === "M" && e.name === "thread_name") threads[`${e.pid}/${e.tid}`] = e.args.name;
  const bars = evs.filter((e) => e.ph === "X"), mem = evs.filter((e) => e.ph === "C");
  const tl = $("timeline");
  tl.replaceChildren();
  if (!bars.length && !mem.length) { tl.append(el("div", { class: "tl-devname" }, "no profile in this trace (run with PROFILE=1)")); return; }
  if (!state.full) {
    const lo = Math.min(...bars.map((e) => e.ts), ...mem.map((e) => e.ts));
    state.full = [lo, lo + Math.max(Math.max(...bars.map((e) => e.ts + e.dur), ...mem.map((e) => e.ts)) - lo, 1e-3)];
  }
  const [t0, t1] = state.view || state.full, span = t1 - t0;
  const pct = (t) => `${((t - t0) / span) * 100}%`;
  $("timeline-info").textContent = `${bars.filter((e) => e.cat === "kernel").length} launches, ${bars.filter((e) => e.cat === "copy").length} copies, ` +
    `${bars.filter((e) => e.cat === "jit").length} JIT replays over ${fmtUs(state.full[1] - state.full[0])}` +
    (state.view ? `, showing ${fmtUs(span)} (double-click: all)` : ", wheel: zoom, drag: pan") + (state.profile.otherData && state.profile.otherData.truncated ? " (profile truncated)" : "");
  const axis = el("div", { class: "tl-axis" });
  for (let i = 0; i <= 5; i++) axis.append(el("span", { style: `left:${i * 20}%;transform:translateX(-${i * 20}%)` }, fmtUs(t0 - state.full[0] + (span * i) / 5)));
  tl.append(axis);
  for (const pid of Object.keys(procs)) {
    const dev = el("div", { class: "tl-device", "data-device": procs[pid] }, el("div", { class: "tl-devname" }, procs[pid]));
    for (const kind of ["kernel", "copy", "jit"]) {
      const mine = bars.filter((e) => String(e.pid) === pid && e.cat === kind);
      if (!mine.length) continue;
      const row = el("div", { class: "tl-row" }, el("span", { class: "tl-label" }, kind));
      for (const e of mine) {
        if (e.ts > t1 || e.ts + e.dur < t0) continue;
        const b = el("div", { class: `bar bar-${kind}`, "data-name": e.name, style: `left:${pct(e.ts)};width:${(e.dur / span) * 100}%`,
                              title: `${e.name} ${fmtUs(e.dur)}` }, e.name);
        b.addEventListener("click", () => {
          const a = e.args || {};
          $("bar-info").textContent = `${e.name} on ${procs[pid]}: ${fmtUs(e.dur)}` + (a.device_us !== undefined ? ` (device ${fmtUs(a.device_us)})` : "") +
            `, ${fmtBytes(a.bytes || 0)}, ${a.flops || 0} FLOPs` + (a.flops && e.dur ? `, ${(a.flops / e.dur / 1e3).toFixed(2)} GFLOPS` : "");
        });
        row.append(b);
      }
      dev.append(row);
    }
    const m = mem.filter((e) => String(e.pid) === pid);
    if (m.length) {
      const peak = Math.max(...m.map((e) => e.args.bytes), 1);
      let pts = `0,60 `, last = 60;
      for (const e of m) {
        const x = Math.min(Math.max(((e.ts - t0) / span) * 1000, -1), 1001), y = 60 - (e.args.bytes / peak) * 56;
        pts += `${x},${last} ${x},${y} `; last = y;
      }
      pts += `1000,${last} 1000,60`;
      const box = el("div", { class: "tl-mem" }, el("span", { class: "tl-label" }, `memory (peak ${fmtBytes(peak)})`));
      box.insertAdjacentHTML("beforeend", `<svg viewBox="0 0 1000 60" preserveAspectRatio="none"><polygon class="mem-area" points="${pts}" fill="#c6dafc" stroke="#1a73e8" stroke-width="1" vector-effect="non-scaling-stroke"/></svg>`);
      dev.append(box);
    }
    tl.append(dev);
  }
}

function zoomTimeline(factor, at) {  // at: 0..1 across the bars' width
  if (!state.full) return;
  const [t0, t1] = state.view || state.full, full = state.full[1] - state.full[0];
  const span = Math.min(Math.max((t1 - t0) * factor, full / 1e6), full), c = t0 + (t1 - t0) * at;
  let lo = Math.max(state.full[0], c - span * at);
  lo = Math.min(lo, state.full[1] - span);
  state.view = span >= full ? null : [lo, lo + span];
  showTimeline();
}

function timelineEvents() {
  const tl = $("timeline");
  const frac = (x) => { const r = tl.getBoundingClientRect(); return Math.min(Math.max((x - r.left - 120) / (r.width - 120), 0), 1); };
  tl.addEventListener("wheel", (e) => { e.preventDefault(); zoomTimeline(e.deltaY > 0 ? 1.25 : 0.8, frac(e.clientX)); }, { passive: false });
  tl.addEventListener("dblclick", () => { state.view = null; showTimeline(); });
  let drag = null;
  tl.addEventListener("mousedown", (e) => { if (state.view) drag = { x: e.clientX, view: state.view.slice() }; });
  window.addEventListener("mouseup", () => { drag = null; });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const r = tl.getBoundingClientRect(), span = drag.view[1] - drag.view[0];
    let lo = drag.view[0] - ((e.clientX - drag.x) / (r.width - 120)) * span;
    lo = Math.min(Math.max(lo, state.full[0]), state.full[1] - span);
    state.view = [lo, lo + span];
    showTimeline();
  });
}

function showTab(which) {
  $("tab-rewrites").classList.toggle("active", which === "rewrites");
  $("tab-timeline").classList.toggle("active", which === "timeline");
  $("view-rewrites").hidden = which !== "rewrites";
  $("view-timeline").hidden = which !== "timeline";
  if (which === "timeline") showTimeline().catch(fail);
}

async function init() {
  $("prev").addEventListener("click", () => step(-1));
  $("next").addEventListener("click", () => step(1));
  $("filter").addEventListener("input", renderGroups);
  $("only-kernels").addEventListener("change", renderGroups);
  $("show-empty").addEventListener("change", () => state.group && renderRewrites());
  $("tab-rewrites").addEventListener("click", () => showTab("rewrites"));
  $("tab-timeline").addEventListener("click", () => showTab("timeline"));
  timelineEvents();
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") return;
    if (e.key === "ArrowRight") step(1); else if (e.key === "ArrowLeft") step(-1);
  });
  const t = await api("/api/trace");
  state.groups = t.groups;
  $("truncated").hidden = !t.truncated;
  setStatus(`${t.groups.filter((g) => g.kind === "kernel").length} kernels, ${t.groups.length} groups`);
  renderGroups();
  updateStepper();
  document.body.dataset.ready = "1";
}

init().catch(fail);
