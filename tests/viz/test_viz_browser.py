"""The viewer in a real browser: headless Debian chromium driven by selenium against a program run with VIZ=1 PROFILE=1.

Skips when chromium/chromedriver or selenium are missing (`make test` installs them). PLUGRAD_VIZ_SHOTS=dir also
writes the screenshots there (docs/img/ holds the ones docs/viz.md shows)."""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest

selenium = pytest.importorskip("selenium")
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason="needs Debian's chromium and chromium-driver (make sysdeps)")


@pytest.fixture(scope="module")
def browser():
  profile = tempfile.mkdtemp(prefix="plugrad-chromium-")
  opts = webdriver.ChromeOptions()
  opts.binary_location = CHROMIUM
  for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,900"):
    opts.add_argument(a)
  drv = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=DRIVER))
  drv.set_page_load_timeout(60)
  try: yield drv
  finally:
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def shot(drv, name: str, tmp_path: Path) -> None:
  """Screenshot, checked to be non-blank: many distinct colours and no single colour covering nearly everything."""
  from PIL import Image
  png = drv.get_screenshot_as_png()
  img = Image.open(io.BytesIO(png)).convert("RGB")
  colors = img.getcolors(maxcolors=1 << 20)
  assert colors is not None and len(colors) > 50, f"{name}: screenshot has {len(colors or [])} colours, looks blank"
  assert max(c for c, _ in colors) < 0.97 * img.width * img.height, f"{name}: screenshot is nearly one colour"
  (tmp_path / f"{name}.png").write_bytes(png)
  if (out := os.environ.get("PLUGRAD_VIZ_SHOTS")):
    Path(out).mkdir(parents=True, exist_ok=True)
    img.quantize(colors=96).save(Path(out) / f"{name}.png", optimize=True)  # small PNGs for docs/img


def wait(drv, cond, timeout: float = 30):
  return WebDriverWait(drv, timeout).until(lambda d: cond(d))


def open_viewer(drv, url: str) -> None:
  """Load the page and wait until it has fetched the trace and drawn."""
  drv.get(url)
  wait(drv, lambda d: d.execute_script("return document.body.dataset.ready") == "1")
  settle(drv)


def step_label(drv) -> str: return drv.find_element(By.ID, "step-label").text


def kernel_named(prefix: str):
  """A finder for the first kernel in the list whose name starts with `prefix`."""
  def find(drv):
    return next(e for e in drv.find_elements(By.CSS_SELECTOR, "#groups li.kind-kernel")
                if e.find_element(By.CSS_SELECTOR, ".gname").text.startswith(prefix))
  return find


def settle(drv) -> None:
  """Wait until the page has no request in flight (and so has redrawn what the last click asked for)."""
  wait(drv, lambda d: d.execute_script("return document.body.dataset.busy") == "0")


def click(drv, target) -> None:
  """Click an element (a CSS selector, or a function finding the element) once the page is idle, then wait until it is
  idle again."""
  settle(drv)
  (drv.find_element(By.CSS_SELECTOR, target) if isinstance(target, str) else target(drv)).click()
  settle(drv)


def test_kernels_rewrites_source_and_timeline(browser, served_program, tmp_path):
  url, report, _ = served_program
  drv = browser
  open_viewer(drv, url)
  # the kernel list holds exactly the program's kernels, by name
  names = [e.text for e in drv.find_elements(By.CSS_SELECTOR, "#groups li.kind-kernel .gname")]
  assert sorted(names) == report["kernels"]
  assert drv.find_elements(By.CSS_SELECTOR, "#groups li.kind-schedule"), "scheduling contexts are listed too"
  assert not drv.find_element(By.ID, "truncated").is_displayed()

  # a kernel whose codegen rewrote something: its steps, its source, its AST/opts/linear panes
  kname = kernel_named("r_")(drv).find_element(By.CSS_SELECTOR, ".gname").text
  click(drv, kernel_named("r_"))
  wait(drv, lambda d: kname in d.find_element(By.ID, "group-title").text and d.find_element(By.ID, "k-src").text)
  src = drv.find_element(By.ID, "k-src").text
  assert kname in src, "the rendered source defines the kernel"
  assert "RANGE" in drv.find_element(By.ID, "k-linear").text and "STORE" in drv.find_element(By.ID, "k-ast").text
  wait(drv, lambda d: d.find_elements(By.CSS_SELECTOR, "#graph svg g.node"))
  rewrites = drv.find_elements(By.CSS_SELECTOR, "#rewrites li.rewrite[data-rid]")
  assert rewrites, "the kernel's codegen rewrites with steps are listed"
  label = step_label(drv)
  assert label.startswith("step 0 / ") and int(label.split("/")[1]) >= 1
  shot(drv, "viz_kernel", tmp_path)

  # step forward: the rule is shown and the nodes it created are highlighted; then back again
  svg0 = drv.find_element(By.ID, "graph").get_attribute("innerHTML")
  click(drv, "#next")
  wait(drv, lambda d: step_label(d).startswith("step 1 / "))
  assert ".py:" in drv.find_element(By.ID, "rule").text, "the rule's location is shown"
  assert drv.find_element(By.ID, "graph").get_attribute("innerHTML") != svg0
  assert drv.find_elements(By.CSS_SELECTOR, '#graph svg g.node polygon[stroke="#d93025"], #graph svg g.node path[stroke="#d93025"]'), \
    "the nodes the step created are highlighted"
  click(drv, "#prev")
  wait(drv, lambda d: step_label(d).startswith("step 0 / "))
  wait(drv, lambda d: d.find_element(By.ID, "graph").get_attribute("innerHTML") == svg0)

  # an elementwise kernel: the scheduler's rewrites that built its AST are listed with it
  click(drv, kernel_named("E_"))
  wait(drv, lambda d: "kernel E_" in d.find_element(By.ID, "group-title").text)
  built = [e.text for e in drv.find_elements(By.CSS_SELECTOR, "#rewrites li.from-schedule")]
  assert built and built[0].startswith("schedule: indexing"), built
  click(drv, "#rewrites li.from-schedule")
  wait(drv, lambda d: step_label(d).startswith("step 0 / "))
  for k in range(1, 5):
    click(drv, "#next")
    wait(drv, lambda d, k=k: step_label(d).startswith(f"step {k} / "))
  assert "pm_index" in drv.find_element(By.ID, "rule").text or "indexing.py:" in drv.find_element(By.ID, "rule").text
  shot(drv, "viz_step", tmp_path)

  # a scheduling context: the indexing pass has many steps
  click(drv, "#groups li.kind-schedule")
  wait(drv, lambda d: d.find_element(By.ID, "group-title").text.startswith("schedule"))
  assert not drv.find_element(By.ID, "kernel-panes").is_displayed()

  # the timeline: one bar per kernel launch, memory drawn below
  click(drv, "#tab-timeline")
  wait(drv, lambda d: d.find_elements(By.CSS_SELECTOR, ".bar"))
  bars = drv.find_elements(By.CSS_SELECTOR, ".bar.bar-kernel")
  assert len(bars) == report["launches"] == report["counted"]
  assert {b.get_attribute("data-name") for b in bars} == set(report["kernels"])
  assert sorted(e.get_attribute("data-device") for e in drv.find_elements(By.CSS_SELECTOR, ".tl-device")) == report["devices"]
  assert drv.find_elements(By.CSS_SELECTOR, ".bar.bar-copy") and drv.find_elements(By.CSS_SELECTOR, ".bar.bar-jit")
  assert drv.find_elements(By.CSS_SELECTOR, ".tl-mem polygon.mem-area")
  bars[0].click()
  wait(drv, lambda d: "FLOPs" in d.find_element(By.ID, "bar-info").text)
  shot(drv, "viz_timeline", tmp_path)

  # zoom in with the wheel (fewer bars fit), double-click shows everything again
  wide = drv.find_element(By.ID, "timeline").rect["width"]
  for _ in range(12):
    drv.execute_script("const t = document.getElementById('timeline'), r = t.getBoundingClientRect();"
                       "t.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + 130, clientY: r.top + 40,"
                       " bubbles: true, cancelable: true}));")
  wait(drv, lambda d: "showing" in d.find_element(By.ID, "timeline-info").text)
  assert len(drv.find_elements(By.CSS_SELECTOR, ".bar.bar-kernel")) < len(bars) and drv.find_element(By.ID, "timeline").rect["width"] == wide
  ActionChains(drv).double_click(drv.find_element(By.CSS_SELECTOR, ".tl-devname")).perform()
  wait(drv, lambda d: "showing" not in d.find_element(By.ID, "timeline-info").text)
  assert len(drv.find_elements(By.CSS_SELECTOR, ".bar.bar-kernel")) == report["launches"]


def canvas_data(drv) -> dict: return drv.execute_script("return Object.assign({}, document.getElementById('waves-canvas').dataset)")


def hover(drv, row: int, inst: int) -> None:
  """Move the real mouse over instruction `inst` of wave row `row` (the page's probe says where it is drawn)."""
  p = drv.execute_script(f"return wavesProbe.point({row}, {inst})")
  cv = drv.find_element(By.ID, "waves-canvas")
  r = drv.execute_script("const b = arguments[0].getBoundingClientRect(); return {x: b.left + b.width / 2, y: b.top + b.height / 2}", cv)
  ActionChains(drv).move_to_element_with_offset(cv, int(p["x"] - r["x"]), int(p["y"] - r["y"])).perform()


def test_waves_view(browser, served_program, tmp_path):
  from viz_helpers import BIG_WAVES_INSTS, HOT, WAVES
  url, report, _ = served_program
  drv = browser
  open_viewer(drv, url)
  assert drv.find_element(By.ID, "tab-waves").is_displayed()
  # the traced kernel links to its launches' waves
  traced = report["traced"][0]
  click(drv, lambda d: next(e for e in d.find_elements(By.CSS_SELECTOR, "#groups li.kind-kernel")
                            if e.find_element(By.CSS_SELECTOR, ".gname").text == traced))
  wait(drv, lambda d: "2 traced launches" in d.find_element(By.ID, "k-waves").text)
  click(drv, "#k-waves button")
  wait(drv, lambda d: d.find_element(By.ID, "view-waves").is_displayed() and canvas_data(d).get("rows") == str(len(WAVES)))
  settle(drv)
  rows = drv.execute_script("return wavesProbe.rows()")
  want = sorted((se, cu, simd, slot, a, b, len(ins)) for se, cu, simd, slot, a, b, ins in WAVES)
  assert [(r["se"], r["cu"], r["simd"], r["slot"], r["start"], r["end"], r["insts"]) for r in rows] == want
  assert int(canvas_data(drv)["drawn"]) == sum(len(w[6]) for w in WAVES), "every instruction is drawn when they fit"
  # hovering an instruction shows its text, PC, cycle and duration; clicking keeps it
  hover(drv, 0, 1)  # the first wave's s_waitcnt: pc 8, cycle 14, 20 cycles
  wait(drv, lambda d: d.find_element(By.ID, "wave-tip").is_displayed())
  tip = drv.find_element(By.ID, "wave-tip").text
  assert tip.startswith("s_waitcnt lgkmcnt(0)") and "pc 0x8" in tip and "cycle 14 " in tip and "20 cycles" in tip and "WAIT" in tip, tip
  ActionChains(drv).click().perform()
  wait(drv, lambda d: d.find_element(By.ID, "wave-sel").text.split() == tip.split())
  hot = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in drv.find_elements(By.CSS_SELECTOR, "#hot tbody tr")]
  assert [(int(h[0], 16), h[1], int(h[3]), int(h[4])) for h in hot] == HOT
  assert [float(h[5]) for h in hot] == [round(total / n, 1) for _, _, n, total in HOT]
  shot(drv, "viz_waves", tmp_path)

  # the big launch: only the visible rows are drawn, at most one instruction per pixel column, quickly
  drv.execute_script("const s = document.getElementById('wave-launch'); s.value = '1'; s.dispatchEvent(new Event('change'))")
  wait(drv, lambda d: canvas_data(d).get("rows") == str(BIG_WAVES_INSTS // 500))
  settle(drv)
  d = canvas_data(drv)
  width = drv.execute_script("return document.getElementById('waves-canvas').width")
  assert 0 < int(d["visibleRows"]) < BIG_WAVES_INSTS // 500 and int(d["drawn"]) <= int(d["visibleRows"]) * width
  times = drv.execute_script("const t = [], b = document.getElementById('waves-scroll'), c = document.getElementById('waves-canvas');"
                             "for (let k = 0; k < 20; k++) { b.scrollTop = k * 60; drawWaves(); t.push(+c.dataset.drawMs); }"
                             "return t")
  assert sorted(times)[len(times) // 2] < 50, f"redraw times (ms) {times}"
  for _ in range(10):  # zoom in around the middle: fewer instructions drawn, each wider
    drv.execute_script("const c = document.getElementById('waves-canvas'), r = c.getBoundingClientRect();"
                       "c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, ctrlKey: true, clientX: r.left + r.width / 2,"
                       " clientY: r.top + 50, bubbles: true, cancelable: true}))")
  assert 0 < int(canvas_data(drv)["drawn"]) < int(d["drawn"])
  shot(drv, "viz_waves_big", tmp_path)

  # from the timeline: a traced launch's bar offers its waves
  click(drv, "#tab-timeline")
  wait(drv, lambda d: d.find_elements(By.CSS_SELECTOR, ".bar.bar-kernel"))
  next(b for b in drv.find_elements(By.CSS_SELECTOR, ".bar.bar-kernel") if b.get_attribute("data-name") == traced).click()
  wait(drv, lambda d: d.find_elements(By.CSS_SELECTOR, "#bar-info button.waves-link"))
  click(drv, "#bar-info button.waves-link")
  wait(drv, lambda d: d.find_element(By.ID, "view-waves").is_displayed() and canvas_data(d).get("rows") == str(len(WAVES)))


def test_sqtt_matmul_on_mock_amd_shows_waves(browser, served_amd_matmul, tmp_path):
  """Issue 43's acceptance: a matmul run with DEV=MOCK+AMD SQTT=1 VIZ=1 shows its waves and instructions in the browser,
  the instructions being the kernel's own (llvm-objdump's text at the traced PCs)."""
  url, report, _ = served_amd_matmul
  assert report["traced"] and report["insts"][-1] > 0, report
  drv = browser
  open_viewer(drv, url)
  click(drv, "#tab-waves")
  drv.execute_script(f"const s = document.getElementById('wave-launch'); s.value = '{len(report['traced']) - 1}';"
                     "s.dispatchEvent(new Event('change'))")
  wait(drv, lambda d: d.find_element(By.ID, "view-waves").is_displayed() and canvas_data(d).get("rows") == str(report["waves"][-1]))
  settle(drv)
  rows = drv.execute_script("return wavesProbe.rows()")
  assert len(rows) == report["waves"][-1] and sum(r["insts"] for r in rows) == report["insts"][-1]
  traced_row = next(i for i, r in enumerate(rows) if r["insts"])
  hover(drv, traced_row, 0)
  wait(drv, lambda d: d.find_element(By.ID, "wave-tip").is_displayed())
  tip = drv.find_element(By.ID, "wave-tip").text
  texts = {t for _, t in report["first"]}
  assert any(tip.startswith(t) for t in texts) and "pc 0x" in tip, (tip, texts)
  hot = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in drv.find_elements(By.CSS_SELECTOR, "#hot tbody tr")]
  assert hot and sum(int(h[3]) for h in hot) <= report["insts"][-1] and any(h[1].startswith("v_") for h in hot)
  shot(drv, "viz_waves_mock_amd", tmp_path)
