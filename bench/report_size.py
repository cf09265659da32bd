"""``envhub report`` on a long run: generation time, page size and browser load time.

Builds a synthetic run folder of ``--steps`` steps x ``--episodes`` episodes by repeating a real
run's trajectories and metrics (default: the quickstart run), then times ``envhub report`` on it
(tokenizer load and decoding included) and, when Debian's Chromium is installed, the time until the
page has drawn its curves and the first step's episode.

    python bench/report_size.py --source outputs/train/quickstart --steps 200 --episodes 50
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def synthetic_run(source: Path, target: Path, steps: int, episodes: int) -> None:
    """A run folder with ``steps`` steps of ``episodes`` episodes, repeated from ``source``."""
    rows = [json.loads(x) for x in (source / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "reward/mean" in r]
    lines = [
        line
        for file in sorted((source / "trajectories").glob("step-*.jsonl"))
        for line in file.read_text().splitlines()
    ]
    (target / "trajectories").mkdir(parents=True)
    shutil.copy(source / "config.json", target / "config.json")
    metrics = [{**train_rows[(s - 1) % len(train_rows)], "step": s} for s in range(1, steps + 1)]
    (target / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    pool = itertools.cycle(lines)
    for step in range(1, steps + 1):
        chunk = [next(pool) for _ in range(episodes)]
        (target / "trajectories" / f"step-{step:06d}.jsonl").write_text("\n".join(chunk) + "\n")


def browser_load_seconds(page: Path) -> float | None:
    """Seconds until headless Chromium has loaded ``page`` (curves and first episode drawn)."""
    if not Path("/usr/bin/chromedriver").exists():
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"):
        options.add_argument(flag)
    options.add_argument("--user-data-dir=" + tempfile.mkdtemp())
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        started = time.perf_counter()
        driver.get(page.as_uri())  # returns after the load event: scripts have run
        assert driver.execute_script("return document.querySelectorAll('#tokens .tok').length")
        return time.perf_counter() - started
    finally:
        driver.quit()


def main() -> None:
    """Build the synthetic run, report on it, print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("outputs/train/quickstart"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "long-run"
        synthetic_run(args.source, run, args.steps, args.episodes)
        started = time.perf_counter()
        envhub = Path(sys.executable).parent / "envhub"
        subprocess.run([str(envhub), "report", str(run)], check=True)
        seconds = time.perf_counter() - started
        page = run / "report.html"
        print(
            f"{args.steps} steps x {args.episodes} episodes: report in {seconds:.1f} s "
            f"(whole command), page {page.stat().st_size / 1e6:.1f} MB, "
            f"browser load {browser_load_seconds(page) or float('nan'):.1f} s"
        )


if __name__ == "__main__":
    main()
