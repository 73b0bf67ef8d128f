"""The HTML timeline, opened in real headless Chromium (Debian's package, installed by scripts/setup.sh)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ddpdoctor.findings import Evidence, Finding, Fix, Location, dumps

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned=2\">'\"&"


def write_run(directory: Path, ranks: dict[int, list[dict]], findings: list[Finding]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(dumps(findings))
    for rank, records in ranks.items():
        (directory / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def record(seq: int, op: str, shape: list[int], path: str = "train.py", line: int = 10, **extra) -> dict:
    """One line of a rank-<r>.jsonl as the guard writes it (docs/guard.md)."""
    return {"rank": 0, "index": seq + 1, "group": "0", "seq": seq, "op": op, "reduce_op": None, "root": None,
            "shapes": [shape], "dtypes": ["float32"], "devices": ["cpu"], "site": [path, line, "main", None],
            "library": None, "time": 0.0, "state": "done", **extra}


@pytest.fixture
def hostile_run(tmp_path: Path) -> Path:
    finding = Finding(
        class_="collective-divergence",
        message=f"shape mismatch: rank 0 all_reduce [3] vs rank 1 all_reduce [5] at {HOSTILE}",
        locations=(Location(HOSTILE, 11, rank=0), Location("train.py", 11, rank=1)),
        fix=Fix(f"make the shapes equal {HOSTILE}"),
        evidence=(Evidence(HOSTILE, rank=0),),
    )
    ranks = {
        0: [record(1, "broadcast", [20]), record(2, "all_reduce", [3], path=HOSTILE, line=11, state="in",
                                                   stack=[f"File {HOSTILE}, line 11, in <module>"])],
        1: [record(1, "broadcast", [20]), record(2, "all_reduce", [5], line=11, state="in")],
        2: [record(1, "broadcast", [20])],
    }
    return write_run(tmp_path / "run", ranks, [finding])


def open_page(page_path: Path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(
                "chromium is missing: scripts/browser.sh (run by scripts/test.sh) should have installed it"
            )
        pytest.skip(f"no browser for the HTML report test: {CHROMIUM} is missing (scripts/test.sh installs "
                    "Debian's chromium with apt-get, which needs root)")
    return sync_api, page_path.as_uri()


def test_report_html_renders_lanes_divergence_and_escapes_hostile_names(
    cli, hostile_run: Path, tmp_path: Path
):
    html_file = tmp_path / "report.html"
    result = cli("report", str(hostile_run), "--html", str(html_file))
    assert result.returncode == 1, result.stderr  # the run had findings
    text = html_file.read_text()
    assert "<script>window.__pwned" not in text
    assert "http://" not in text and "https://" not in text  # self-contained: nothing fetched

    sync_api, url = open_page(html_file)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 700})
            problems: list[str] = []
            page.on(
                "console",
                lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url) if not r.url.startswith("file:") else None)
            page.goto(url)

            assert page.locator("tr.lane").count() == 3
            divergent = page.locator(".call.divergent")
            assert divergent.count() == 2
            assert {divergent.nth(i).get_attribute("data-seq") for i in range(2)} == {"2"}
            assert page.locator(".missing.divergent").count() == 1  # rank 2 never reached #2
            assert page.evaluate("window.__pwned") is None
            assert HOSTILE in page.inner_text("#findings")

            page.locator('.call.divergent[data-rank="0"]').click()
            detail = page.inner_text("#detail")
            assert "rank 0 · seq 2 · all_reduce" in detail and HOSTILE in detail
            assert f"called at: {HOSTILE}:11" in detail
            assert page.locator(".call.waiting").count() == 2  # state "in": entered, never returned

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report-hostile.png"), full_page=True)
            assert problems == [] and requests == []
        finally:
            browser.close()


def test_a_rank_without_a_collective_at_the_divergence_shows_what_the_verdict_says_of_it(cli, tmp_path: Path):
    """The crashed rank's cell at the divergent position says how it ended and where (not an empty dash);
    clicking it shows the whole row of the report."""
    dead = f"dead (killed by SIGSEGV at crash.py:8 in load_batch; after all_reduce(SUM) [4] float32, #2 of " \
           f"group 0, at crash.py:17 in main) {HOSTILE}"
    finding = Finding(
        class_="dead-rank",
        message="rank 1 died (killed by SIGSEGV ...) at crash.py:8 in load_batch",
        facts={
            "group": "0",
            "seq": 3,
            "ranks": {"0": {"state": "in all_reduce(SUM) [4] float32"}, "1": {"state": dead}},
        },
    )
    ranks = {0: [record(seq, "all_reduce", [4], path="crash.py", line=17) for seq in range(3)]
             + [record(3, "all_reduce", [4], path="crash.py", line=17, state="in")],
             1: [record(seq, "all_reduce", [4], path="crash.py", line=17) for seq in range(3)]}
    html_file = tmp_path / "report.html"
    assert (
        cli("report", str(write_run(tmp_path / "run", ranks, [finding])), "--html", str(html_file)).returncode
        == 1
    )
    sync_api, url = open_page(html_file)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(url)
            cell = page.locator('.missing.divergent[data-rank="1"]')
            assert cell.inner_text() == "dead (killed by SIGSEGV at crash.py:8 in load_batch)"
            cell.click()
            assert page.inner_text("#detail") == f"rank 1: {dead}"
            assert page.evaluate("window.__pwned") is None
        finally:
            browser.close()


def test_a_deep_call_site_keeps_its_file_name_and_line_in_the_lane(cli, tmp_path: Path):
    """The lane's call-site line shows the end of a deep path (`…/checkout/train.py:31`), the whole path on
    hover and in the details, in a real browser."""
    deep = "/home/ci/work/team-project/team-project/experiments/2026-11-24/sweep-17/nested/checkout/train.py"
    ranks = {
        0: [record(0, "all_reduce", [4], path=deep, line=31)],
        1: [record(0, "all_reduce", [4], path=deep, line=31)],
    }
    html_file = tmp_path / "report.html"
    assert (
        cli("report", str(write_run(tmp_path / "run", ranks, [])), "--html", str(html_file)).returncode == 0
    )
    sync_api, url = open_page(html_file)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(url)
            call = page.locator('.call[data-rank="0"]')
            site = call.locator(".site").inner_text()
            assert site.startswith("…/") and site.endswith("/checkout/train.py:31"), site
            assert f"{deep}:31" in (call.get_attribute("title") or "")
            call.click()
            assert f"called at: {deep}:31" in page.inner_text("#detail")
        finally:
            browser.close()


def test_report_in_terminal_lists_findings_and_ranks(cli, hostile_run: Path):
    result = cli("report", str(hostile_run))
    assert result.returncode == 1
    assert "collective-divergence" in result.stdout
    assert "rank 2" in result.stdout


def test_a_rank_file_whose_last_line_was_cut_short_is_read_up_to_it(cli, hostile_run: Path):
    whole = (hostile_run / "rank-1.jsonl").read_text()
    # 29 bytes of its last line
    (hostile_run / "rank-1.jsonl").write_text(whole[: whole.rindex("\n", 0, -1) + 30])
    result = cli("report", str(hostile_run))
    assert result.returncode == 1, result.stderr
    assert "rank-1.jsonl: its last line is cut short (line 2); read up to line 1" in result.stdout
    assert "rank 1: last 1 collective(s)" in result.stdout


def test_a_run_without_report_json_is_not_called_clean(cli, hostile_run: Path, tmp_path: Path):
    (hostile_run / "report.json").unlink()
    result = cli("report", str(hostile_run))
    assert result.returncode == 1, result.stderr
    text = " ".join(result.stdout.split())
    assert "the run was clean" not in text and "No report.json: the job had not finished" in text
    page = tmp_path / "page.html"
    assert cli("report", str(hostile_run), "--html", str(page)).returncode == 1
    assert "the run was clean" not in page.read_text() and "the job had not finished" in page.read_text()


@pytest.mark.parametrize(
    "setup,message",
    [
        (lambda d: None, "not a directory"),
        (lambda d: d.mkdir(), "not a ddpdoctor report directory"),
        (lambda d: (d.mkdir(), (d / "report.json").write_bytes(b"\x00\xff\xfe")), "not UTF-8"),
        (lambda d: (d.mkdir(), (d / "rank-0.jsonl").write_text("{not json\n")), "rank-0.jsonl:1"),
        (
            lambda d: (
                d.mkdir(),
                (d / "rank-0.jsonl").write_text("{not json\n" + json.dumps(record(1, "barrier", []))),
            ),
            "rank-0.jsonl:1",
        ),
    ],
)
def test_report_bad_input_is_one_line_and_exit_2(cli, tmp_path: Path, setup, message):
    target = tmp_path / "dir"
    setup(target)
    result = cli("report", str(target), "--html", str(tmp_path / "out.html"))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.html").exists()
