"""The built site as a reader meets it, in a real browser (headless Chromium through Selenium).

``check(site, screenshots)`` serves a built site (``mkdocs build``) on 127.0.0.1, opens the home page,
a guide and the layers' API page, and returns what a reader would find wrong: a search for
``DenseFlipout`` that lists no result, a local link that does not answer 200, an image that does not
load, a code block without its copy button. It saves a screenshot of each page (and of the search) in
``screenshots``. ``tests/test_api_docs.py`` runs it on the strict build.

By hand, to look at the pages (writes ``docs/assets/screenshots/*.png``)::

    python docs/browser.py
    python docs/browser.py --tensorboard    # the posterior board's dashboards (tensorboard-*.png)

``--tensorboard`` trains the main job's recipe for 20 epochs with ``tensorboard=`` (Keras' TensorBoard
callback and ``tfbnn.callbacks.PosteriorBoard``), serves the logs with TensorBoard on 127.0.0.1 and
saves its scalars, histograms and images dashboards.

Chromium and its driver come from Debian (``apt-get install chromium chromium-driver``; ``.ci/run``
installs them): Playwright's and Selenium's own browsers are downloads from outside the package index.
Selenium is given the driver's path, so it downloads nothing.
"""

import argparse
import functools
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The pages opened, by their path in the site, and the name of their screenshot.
PAGES = {"": "home", "guides/laplace/": "guide-laplace", "api/tfbnn.layers/": "api-layers"}
SEARCH_FOR = "DenseFlipout"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def browser_paths():
    """``(browser, driver)`` executables found on PATH, or None when either is missing."""
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    driver = shutil.which(DRIVER)
    return (browser, driver) if browser and driver else None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _serve(site):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _driver(paths):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(paths[1]), options=options)


def _wait(condition, timeout=20.0):
    """``condition()``'s first truthy value within ``timeout`` seconds (else its last value)."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > end:
            return value
        time.sleep(0.2)


_BROKEN_IMAGES = "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
_LINKS = "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
# Material puts a copy button into each code block (pre > code) once its JavaScript has run: a
# button[data-md-type=copy] (Material 9.6 and later), a button.md-clipboard before.
_CODE_BLOCKS = "return document.querySelectorAll('pre > code').length"
_WITHOUT_COPY = ("return Array.from(document.querySelectorAll('pre')).filter(p => p.querySelector(':scope > code')"
                 " && !p.querySelector('[data-md-type=copy], .md-clipboard')).length")
_SEARCH_RESULTS = ("return Array.from(document.querySelectorAll('.md-search-result__item'))"
                   ".map(e => e.textContent)")


def _status(url):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def check(site, screenshots, paths=None):
    """The problems a reader meets on the served ``site`` (a list of strings; empty: none).

    Args:
        site: the folder ``mkdocs build`` wrote.
        screenshots: a folder; ``<page>.png`` of every page of PAGES and ``search.png`` land there.
        paths: ``(browser, driver)`` executables (default: :func:`browser_paths`).
    """
    paths = paths or browser_paths()
    if paths is None:
        raise RuntimeError(f"No Chromium and chromedriver on PATH (looked for {BROWSERS} and {DRIVER!r}). Install "
                           "Debian's: apt-get install chromium chromium-driver")
    os.makedirs(screenshots, exist_ok=True)
    server, origin = _serve(site)
    driver = _driver(paths)
    problems, checked = [], {}
    try:
        for page, name in PAGES.items():
            driver.get(origin + page)
            if not _wait(lambda: driver.execute_script("return document.readyState") == "complete"):
                problems.append(f"{page or 'home'}: the page did not finish loading")
            blocks = driver.execute_script(_CODE_BLOCKS)
            if not blocks:
                problems.append(f"{page or 'home'}: no code block")
            elif _wait(lambda: driver.execute_script(_WITHOUT_COPY) == 0, timeout=10) is False:
                problems.append(f"{page or 'home'}: {driver.execute_script(_WITHOUT_COPY)} of {blocks} code blocks "
                                "have no copy button")
            problems += [f"{page or 'home'}: image does not load: {src}" for src in driver.execute_script(_BROKEN_IMAGES)]
            for link in driver.execute_script(_LINKS):
                url = urllib.parse.urldefrag(link)[0]
                if url.startswith(origin) and url not in checked:
                    checked[url] = _status(url)
                    if checked[url] != 200:
                        problems.append(f"{page or 'home'}: broken link {url} ({checked[url]})")
            driver.save_screenshot(os.path.join(screenshots, f"{name}.png"))
        # Search as a reader does: open the search box, type, read the results Material lists.
        driver.get(origin)
        _wait(lambda: driver.execute_script("return document.readyState") == "complete")
        driver.execute_script("document.querySelector('label.md-search__icon, label[for=__search]').click()")
        box = driver.find_element("css selector", "input.md-search__input")
        box.send_keys(SEARCH_FOR)
        results = _wait(lambda: driver.execute_script(_SEARCH_RESULTS))
        driver.save_screenshot(os.path.join(screenshots, "search.png"))
        if not any(SEARCH_FOR in text for text in results or []):
            problems.append(f"search for {SEARCH_FOR!r} lists no result naming it ({len(results or [])} results)")
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
    return problems


#: TensorBoard's dashboards screenshot by ``--tensorboard``: route -> its query (the scalars: the board's own tags,
#: the KL terms and the prunable fractions, not Keras' loss and accuracy).
DASHBOARDS = {"scalars": "&tagFilter=%5Ekl%7Cprunable", "histograms": "", "images": ""}


def tensorboard_screenshots(log_dir, screenshots, paths=None, settle=8.0):
    """Serves ``log_dir`` with TensorBoard on 127.0.0.1 and saves ``tensorboard-<dashboard>.png`` of DASHBOARDS."""
    paths = paths or browser_paths()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    board = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir), "--host",
                              "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    driver = None
    try:
        if not _wait(lambda: _answers(url), timeout=60):
            raise RuntimeError(f"TensorBoard did not answer at {url} within 60 s")
        driver = _driver(paths)
        os.makedirs(screenshots, exist_ok=True)
        for dashboard, query in DASHBOARDS.items():
            driver.get(f"{url}#{dashboard}{query}")
            time.sleep(settle)  # TensorBoard draws its charts after the page has loaded
            driver.save_screenshot(os.path.join(screenshots, f"tensorboard-{dashboard}.png"))
    finally:
        if driver is not None:
            driver.quit()
        board.terminate()
        board.wait(timeout=30)


def _answers(url):
    try:
        return _status(url) == 200
    except OSError:
        return False


def _board_logs(log_dir, epochs=20):
    """The main job's recipe trained ``epochs`` epochs with its TensorBoard logs in ``log_dir``."""
    from tfbnn import training

    training.run(training.get_recipe("digits-bbb-mlp").replace(epochs=epochs), output_dir=os.path.join(log_dir, "run"),
                 verbose=0, tensorboard=os.path.join(log_dir, "logs"), figures=False, quiet=True)
    return os.path.join(log_dir, "logs")


def main(argv=None):
    """Builds the site into a temporary folder and checks it (``--tensorboard``: the board's dashboards instead);
    the screenshots go to docs/assets/screenshots/."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensorboard", action="store_true", help="screenshot the posterior board in TensorBoard")
    args = parser.parse_args(argv)
    out = os.path.join(ROOT, "docs", "assets", "screenshots")
    with tempfile.TemporaryDirectory() as work:
        if args.tensorboard:
            tensorboard_screenshots(_board_logs(work), out)
            print(f"screenshots of {', '.join(DASHBOARDS)} in {out}")
            return 0
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", work], cwd=ROOT, check=True,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        problems = check(work, out)
    print("\n".join(problems) or f"no problem found; screenshots in {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
