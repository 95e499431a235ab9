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
  const traced = k ? launchesOf(k.name, k.device) : [];
  $("k-waves").replaceChildren(...(traced.length ? [wavesButton(traced, `waves: ${traced.length} traced launch${traced.length > 1 ? "es" : ""}`)] : []));
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

const TL_KINDS = ["kernel", "copy", "jit"];  // the traced waves' bars ("wave", "inst") are for Perfetto and the waves view

async function showTimeline() {
  if (!state.profile) state.profile = await api("/api/profile");
  const evs = state.profile.traceEvents || [];
  const procs = {}, threads = {};
  for (const e of evs) if (e.ph === "M" && e.name === "process_name") procs[e.pid] = e.args.name;
  for (const e of evs) if (e.ph === "M" && e.name === "thread_name") threads[`${e.pid}/${e.tid}`] = e.args.name;
  const bars = evs.filter((e) => e.ph === "X" && TL_KINDS.includes(e.cat)), mem = evs.filter((e) => e.ph === "C");
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
    for (const kind of TL_KINDS) {
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
          const ls = kind === "kernel" ? launchesOf(e.name, procs[pid]) : [];  // the traced launch nearest this bar
          ls.sort((x, y) => Math.abs(x.st_us - e.ts) - Math.abs(y.st_us - e.ts));
          if (ls.length) $("bar-info").append(" ", wavesButton(ls, "show its waves"));
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

// ***** waves: a traced launch's waves (device instruction trace, SQTT on AMD) over cycles, and its hot instructions *****
const KIND_COLOR = { VALU: "#1a73e8", SALU: "#9334e6", SMEM: "#e37400", VMEM: "#d93025", LDS: "#188038", BRANCH: "#f9ab00",
                     WAIT: "#bdc1c6", BARRIER: "#202124", OTHER: "#80868b" };
const WV = { LABEL: 150, AXIS: 20, ROW: 14 };
const waves = { launches: null, launch: null, rows: [], view: null, hl: null, tip: null };

function fmtCyclesTime(cycles, hz) { const us = (cycles / hz) * 1e6; return us < 1 ? `${(us * 1e3).toFixed(1)} ns` : fmtUs(us); }
function fmtHex(n) { return `0x${n.toString(16)}`; }
function instInfo(r, i) {
  const L = waves.launch;
  return { text: L.texts[i[4]], pc: i[0], cycle: i[1], duration: i[2], kind: L.kinds[i[3]], wave: `SE${r.se} CU${r.cu} SIMD${r.simd} wave ${r.slot}` };
}
function instLine(x) { return `${x.text}  pc ${fmtHex(x.pc)}  cycle ${x.cycle}  ${x.duration} cycles  ${x.kind}  (${x.wave})`; }

async function loadLaunches() {
  if (!waves.launches) waves.launches = (await api("/api/waves")).launches;
  return waves.launches;
}

function launchesOf(name, device) { return (waves.launches || []).filter((l) => l.kernel === name && l.device === device); }

async function showWaves(k) {
  const ls = await loadLaunches(), sel = $("wave-launch");
  if (!ls.length) { $("waves-info").textContent = "no traced launches (a device plugin's instruction trace: SQTT=1 on AMD)"; return; }
  if (sel.options.length !== ls.length) {
    sel.replaceChildren(...ls.map((l) => el("option", { value: l.index }, `#${l.index} ${l.kernel} on ${l.device}`)));
  }
  if (k === undefined) k = waves.launch ? waves.launch.launch.index : ls[0].index;
  sel.value = String(k);
  if (!waves.launch || waves.launch.launch.index !== k) await loadLaunch(k);
  drawWaves();
}

async function loadLaunch(k) {
  const L = await api(`/api/waves/${k}`);
  for (const w of L.waves) w.insts.sort((a, b) => a[1] - b[1]);
  waves.rows = L.waves.slice().sort((a, b) => a.se - b.se || a.cu - b.cu || a.simd - b.simd || a.slot - b.slot || a.start - b.start);
  waves.launch = L; waves.view = null; waves.hl = null;
  const l = L.launch;
  $("waves-info").textContent = `${l.kernel} on ${l.device}: ${l.waves} waves, ${l.instructions} instructions over ${l.cycles} cycles` +
    ` (${fmtCyclesTime(l.cycles, l.clock_hz)} at ${(l.clock_hz / 1e9).toFixed(2)} GHz)` + (l.truncated ? ", trace cut short (buffer full)" : "") +
    "; ctrl+wheel: zoom, drag: pan, double-click: all";
  const box = $("waves-scroll"), h = WV.AXIS + waves.rows.length * WV.ROW + 4;
  box.style.height = `${Math.min(h + 2, Math.max(window.innerHeight * 0.55, 120))}px`;
  $("waves-spacer").style.height = `${Math.max(h, box.clientHeight)}px`;
  $("wave-tip").hidden = true;
  $("wave-sel").textContent = "click an instruction to keep its details here";
  $("waves-canvas").dataset.rows = String(waves.rows.length);
  box.scrollTop = 0;
  renderHot();
}

function renderHot() {
  const L = waves.launch, body = $("hot").querySelector("tbody");
  body.replaceChildren(...L.hot.slice(0, 200).map((h) => el("tr", { "data-pc": h.pc, class: waves.hl === h.pc ? "selected" : "",
    onclick: () => { waves.hl = waves.hl === h.pc ? null : h.pc; renderHot(); drawWaves(); } },
    el("td", {}, fmtHex(h.pc)), el("td", { class: "code" }, h.text), el("td", {}, h.kind), el("td", {}, String(h.count)),
    el("td", {}, String(h.total)), el("td", {}, h.mean.toFixed(1)))));
  $("hot-info").textContent = L.hot.length > 200 ? `(top 200 of ${L.hot.length} PCs)` : `(${L.hot.length} PCs; click one to mark it)`;
}

function waveScale() {
  const cv = $("waves-canvas"), [c0, c1] = waves.view || waves.launch.span, w = cv.width - WV.LABEL;
  const per = w / Math.max(c1 - c0, 1);
  return { c0, c1, x: (c) => WV.LABEL + (c - c0) * per, c: (x) => c0 + (x - WV.LABEL) / per, per };
}

function firstInst(insts, c) {  // the first instruction ending at or after cycle c (instructions are sorted by cycle)
  let lo = 0, hi = insts.length;
  while (lo < hi) { const m = (lo + hi) >> 1; if (insts[m][1] + insts[m][2] < c) lo = m + 1; else hi = m; }
  return lo;
}

function drawWaveRow(ctx, r, y, s) {
  let drawn = 0, lastPx = -1;
  ctx.fillStyle = "#e8eaed";
  const a = Math.max(s.x(r.start), WV.LABEL), b = Math.min(s.x(r.end), ctx.canvas.width);
  if (b > a) ctx.fillRect(a, y + 2, Math.max(b - a, 1), WV.ROW - 4);
  for (let j = firstInst(r.insts, s.c0); j < r.insts.length && r.insts[j][1] <= s.c1; j++) {
    const i = r.insts[j], x0 = Math.max(s.x(i[1]), WV.LABEL), x1 = s.x(i[1] + i[2]);
    if (x1 - x0 < 1 && Math.floor(x0) <= lastPx) continue;  // aggregated: one instruction per pixel column when zoomed out
    ctx.fillStyle = waves.hl === i[0] ? "#000" : KIND_COLOR[waves.launch.kinds[i[3]]] || "#80868b";
    const wd = Math.max(x1 - x0 - (x1 - x0 > 3 ? 1 : 0), 1);
    ctx.fillRect(x0, y + 1, wd, WV.ROW - 2);
    lastPx = Math.floor(x0 + wd);
    drawn++;
  }
  return drawn;
}

function drawWaveAxis(ctx, s) {
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, ctx.canvas.width, WV.AXIS);
  ctx.fillStyle = "#5f6368"; ctx.font = "10px sans-serif";
  for (let k = 0; k <= 5; k++) {
    const c = s.c0 + ((s.c1 - s.c0) * k) / 5, x = s.x(c);
    ctx.fillText(`${Math.round(c)}`, Math.min(x, ctx.canvas.width - 40), 13);
    ctx.fillRect(x, WV.AXIS - 4, 1, 4);
  }
  ctx.fillText("cycle", 6, 13);
}

function drawWaves() {
  const box = $("waves-scroll"), cv = $("waves-canvas");
  if (!waves.launch || box.clientWidth === 0) return;
  const t = performance.now();
  if (cv.width !== box.clientWidth || cv.height !== box.clientHeight) { cv.width = box.clientWidth; cv.height = box.clientHeight; }
  const ctx = cv.getContext("2d"), s = waveScale(), top = box.scrollTop;
  ctx.clearRect(0, 0, cv.width, cv.height);
  ctx.font = "10px ui-monospace, monospace";
  const first = Math.max(Math.floor(top / WV.ROW), 0), last = Math.min(Math.ceil((top + cv.height - WV.AXIS) / WV.ROW), waves.rows.length);
  let drawn = 0;
  for (let n = first; n < last; n++) {
    const r = waves.rows[n], p = waves.rows[n - 1], y = WV.AXIS + n * WV.ROW - top;
    const group = !p || p.se !== r.se || p.cu !== r.cu || p.simd !== r.simd;
    ctx.fillStyle = group ? "#9aa0a6" : "#f1f3f4"; ctx.fillRect(0, y, cv.width, 1);
    ctx.fillStyle = "#3c4043";
    ctx.fillText(group ? `SE${r.se} CU${r.cu} SIMD${r.simd} w${r.slot}` : `w${r.slot}`, group ? 4 : 100, y + WV.ROW - 3);
    drawn += drawWaveRow(ctx, r, y, s);
  }
  drawWaveAxis(ctx, s);
  Object.assign(cv.dataset, { drawn: String(drawn), visibleRows: String(last - first), drawMs: (performance.now() - t).toFixed(2) });
}

function waveHit(ev) {  // the row and instruction under the mouse (within a pixel), or null
  const cv = $("waves-canvas"), b = cv.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
  if (!waves.launch || x < WV.LABEL || y < WV.AXIS) return null;
  const r = waves.rows[Math.floor((y - WV.AXIS + $("waves-scroll").scrollTop) / WV.ROW)];
  if (!r) return null;
  const s = waveScale(), c = s.c(x), tol = 1 / s.per;
  let j = firstInst(r.insts, c - tol);
  while (j < r.insts.length && r.insts[j][1] <= c + tol) {
    if (r.insts[j][1] + Math.max(r.insts[j][2], tol) >= c - tol) return { r, i: r.insts[j] };
    j++;
  }
  return { r, i: null };
}

function waveHover(ev) {
  const h = waveHit(ev), tip = $("wave-tip");
  if (!h) { tip.hidden = true; return; }
  tip.textContent = h.i ? instLine(instInfo(h.r, h.i)) : `SE${h.r.se} CU${h.r.cu} SIMD${h.r.simd} wave ${h.r.slot}: cycles ${h.r.start}..${h.r.end}` +
    (h.r.insts.length ? "" : " (no instructions traced on this SIMD)");
  tip.hidden = false;
  const v = $("view-waves").getBoundingClientRect();
  tip.style.left = `${ev.clientX - v.left + 12}px`; tip.style.top = `${ev.clientY - v.top + $("view-waves").scrollTop + 14}px`;
}

function zoomWaves(factor, x) {
  const s = waveScale(), [lo0, hi0] = waves.launch.span, full = Math.max(hi0 - lo0, 1), c = s.c(x);
  const span = Math.min(Math.max((s.c1 - s.c0) * factor, 4), full);
  let lo = Math.min(Math.max(c - (c - s.c0) * (span / (s.c1 - s.c0)), lo0), hi0 - span);
  waves.view = span >= full ? null : [lo, lo + span];
  drawWaves();
}

function waveEvents() {
  const cv = $("waves-canvas"), box = $("waves-scroll");
  $("wave-legend").replaceChildren(...Object.entries(KIND_COLOR).map(([k, c]) => el("span", { style: `--c:${c}` }, k)));
  box.addEventListener("scroll", () => drawWaves());
  window.addEventListener("resize", () => { if (!$("view-waves").hidden) drawWaves(); });
  cv.addEventListener("mousemove", waveHover);
  cv.addEventListener("mouseleave", () => { $("wave-tip").hidden = true; });
  cv.addEventListener("click", (ev) => { const h = waveHit(ev); if (h && h.i) $("wave-sel").textContent = instLine(instInfo(h.r, h.i)); });
  cv.addEventListener("wheel", (e) => {
    if (!e.ctrlKey && !e.shiftKey) return;
    e.preventDefault(); zoomWaves(e.deltaY > 0 ? 1.25 : 0.8, e.clientX - cv.getBoundingClientRect().left);
  }, { passive: false });
  cv.addEventListener("dblclick", () => { waves.view = null; drawWaves(); });
  let drag = null;
  cv.addEventListener("mousedown", (e) => { if (waves.view) drag = { x: e.clientX, view: waves.view.slice() }; });
  window.addEventListener("mouseup", () => { drag = null; });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const [lo0, hi0] = waves.launch.span, span = drag.view[1] - drag.view[0], per = (cv.width - WV.LABEL) / span;
    const lo = Math.min(Math.max(drag.view[0] - (e.clientX - drag.x) / per, lo0), hi0 - span);
    waves.view = [lo, lo + span]; drawWaves();
  });
  $("wave-launch").addEventListener("change", (e) => showWaves(Number(e.target.value)).catch(fail));
}

// for tests: the rows as drawn, and where (client coordinates) instruction j of row n is drawn after scrolling it into view
window.wavesProbe = {
  rows: () => waves.rows.map((r) => ({ se: r.se, cu: r.cu, simd: r.simd, slot: r.slot, start: r.start, end: r.end, insts: r.insts.length })),
  point(n, j) {
    const box = $("waves-scroll"), r = waves.rows[n], i = r.insts[j];
    box.scrollTop = Math.max(n * WV.ROW - 40, 0); drawWaves();
    const s = waveScale(), b = $("waves-canvas").getBoundingClientRect();
    return { x: b.left + (Math.max(s.x(i[1]), WV.LABEL) + Math.min(s.x(i[1] + i[2]), b.width)) / 2, y: b.top + WV.AXIS + n * WV.ROW - box.scrollTop + WV.ROW / 2 };
  },
};

function wavesButton(ls, label) {  // a button opening the waves view of the first of `ls` (traced launches)
  return el("button", { class: "waves-link", onclick: () => showTab("waves", ls[0].index) }, label);
}

function showTab(which, launch) {
  for (const t of ["rewrites", "timeline", "waves"]) {
    $(`tab-${t}`).classList.toggle("active", which === t);
    $(`view-${t}`).hidden = which !== t;
  }
  if (which === "timeline") showTimeline().catch(fail);
  if (which === "waves") showWaves(launch).catch(fail);
}

async function init() {
  $("prev").addEventListener("click", () => step(-1));
  $("next").addEventListener("click", () => step(1));
  $("filter").addEventListener("input", renderGroups);
  $("only-kernels").addEventListener("change", renderGroups);
  $("show-empty").addEventListener("change", () => state.group && renderRewrites());
  $("tab-rewrites").addEventListener("click", () => showTab("rewrites"));
  $("tab-timeline").addEventListener("click", () => showTab("timeline"));
  $("tab-waves").addEventListener("click", () => showTab("waves"));
  timelineEvents();
  waveEvents();
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") return;
    if (e.key === "ArrowRight") step(1); else if (e.key === "ArrowLeft") step(-1);
  });
  const t = await api("/api/trace");
  state.groups = t.groups;
  $("truncated").hidden = !t.truncated;
  $("tab-waves").hidden = !t.waves;
  if (t.waves) await loadLaunches();
  setStatus(`${t.groups.filter((g) => g.kind === "kernel").length} kernels, ${t.groups.length} groups`);
  renderGroups();
  updateStepper();
  document.body.dataset.ready = "1";
}

init().catch(fail);
