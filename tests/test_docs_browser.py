"""The benchmarks pages as a reader sees them: the built docs site in a real headless browser
(Debian's chromium, driven by Playwright) at 1,400 px. Every table column is at least as wide as its
longest word, each page opens on a picture that loads, and the headline table fits the page.
Screenshots of each page's first screen (and the whole Benchmarks page) go to site/screens/, which
CI keeps as artifacts; RLFLEET_SCREENS puts them elsewhere.

`make test` builds the site first (`make docs-build`); run alone, the test builds it into a
temporary directory when site/ is older than the docs."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1400, 900
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Per table, the columns whose longest word (whitespace apart, each in its own font) is wider than
# the cell's content box; and what opens the article after its title.
LAYOUT = r"""() => {
  const ctx = document.createElement('canvas').getContext('2d');
  const narrow = [];
  document.querySelectorAll('article table').forEach((table, t) => {
    const need = {}, have = {}, word = {};
    for (const row of table.rows) [...row.cells].forEach((cell, c) => {
      const s = getComputedStyle(cell);
      const w = cell.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
      have[c] = Math.min(have[c] ?? Infinity, w);
      const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let n = walk.nextNode(); n; n = walk.nextNode()) {
        ctx.font = getComputedStyle(n.parentElement).font;
        for (const wd of n.textContent.split(/\s+/)) {
          const m = ctx.measureText(wd).width;
          if (m > (need[c] ?? 0)) { need[c] = m; word[c] = wd; }
        }
      }
    });
    for (const c in need) if (need[c] > have[c] + 1)
      narrow.push(`table ${t + 1}, column ${+c + 1}: "${word[c]}" needs ${Math.ceil(need[c])} px, has ${Math.floor(have[c])}`);
  });
  const first = document.querySelector('article h1')?.nextElementSibling;
  const img = first?.tagName === 'IMG' ? first : (first?.children.length === 1 ? first.querySelector(':scope > img') : null);
  const wrap = document.querySelector('article .md-typeset__scrollwrap');
  return {
    narrow,
    first: first ? first.outerHTML.slice(0, 100) : 'nothing',
    picture: !!img && img.complete && img.naturalWidth > 0,
    overflow: wrap ? wrap.scrollWidth - wrap.clientWidth : 0,
  };
}"""


def site_dir(tmp_path_factory) -> Path:
    """site/ when it is newer than what builds it, else a fresh build."""
    site = ROOT / "site" / "benchmarks" / "index.html"
    inputs = [
        ROOT / "mkdocs.yml",
        *(ROOT / "docs").rglob("*"),
        *(ROOT / "benchmarks" / "results").rglob("*.png"),
    ]
    if site.exists() and site.stat().st_mtime >= max(p.stat().st_mtime for p in inputs):
        return ROOT / "site"
    out = tmp_path_factory.mktemp("site")
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """(chromium, the site's base URL): the site served on loopback, as a docs host serves it."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # never a skip: `make test` installs it (the test extra)
        pytest.fail("playwright missing: it is in the test extra (make test installs it)")
    chromium = os.environ.get("RLFLEET_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.fail("chromium missing: run scripts/install-chromium.sh (apt-get install chromium)")
    handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    site = site_dir(tmp_path_factory)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=site))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, args=ARGS)
            try:
                yield b, f"http://127.0.0.1:{server.server_port}", site
            finally:
                b.close()
    finally:
        server.shutdown()


def test_benchmarks_pages_read_well_at_1400_px(browser):
    b, base, site = browser
    screens = Path(os.environ.get("RLFLEET_SCREENS") or ROOT / "site" / "screens")
    screens.mkdir(parents=True, exist_ok=True)
    pages = sorted(p.parent.relative_to(site).as_posix() for p in (site / "benchmarks").glob("**/index.html"))
    pages = [p for p in pages if not p.startswith("benchmarks/results")]
    assert len(pages) >= 9, pages
    page, problems = b.new_page(viewport={"width": WIDTH, "height": HEIGHT}), []
    # nothing from outside (the theme's web fonts): the same fallback fonts everywhere, no waiting
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
    for name in pages:
        page.goto(f"{base}/{name}/", wait_until="load")
        got = page.evaluate(LAYOUT)
        shot = screens / f"{name.replace('/', '-')}-{WIDTH}.png"
        page.screenshot(path=shot, full_page=name == "benchmarks")
        problems += [f"{name}: {n}" for n in got["narrow"]]
        if not got["picture"]:
            problems.append(f"{name}: opens on {got['first']!r}, not a picture that loads")
        if name == "benchmarks" and got["overflow"] > 1:
            problems.append(f"{name}: the headline table is {got['overflow']} px wider than the page")
    assert not problems, "\n".join(problems)
