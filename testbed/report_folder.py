"""`testbed report FOLDER`: a results folder's plots, summary.md and summary.html drawn
again from its own files (testbed.plots draws every plot the run drew, testbed.page the
page, from the same files). A script's folder (its runs in subfolders) gets each run's
done again and its index.html (testbed.page_index) rewritten.

It writes only inside the folder it was given: its `plots` must be a folder there (not
a link elsewhere), and each file is written as a new file renamed over the old one
(testbed.outputs.replace_file), so a link standing in the folder is replaced, never
written through. A run that FAILED stays FAILED in the summary. A folder that is not a
complete results folder, or whose files are damaged, is one line (SpecError naming
`folder`), never a traceback.
"""

from __future__ import annotations

import csv
import tomllib
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from fabric.state import FAILED_FILE
from testbed.outputs import replace_file
from testbed.page import write_run_page
from testbed.page_index import SUMMARIES, run_folders, write_index
from testbed.plots import draw_all
from testbed.results import summary_md
from testbed.run_result import MetricsError, RunResult
from topologies.spec import SpecError

FIELD = "folder"
NEEDED = ("metrics.json", "config.toml", "latency.csv", "links.csv", "flows.csv")
# what a damaged file raises while it is read, drawn or summarized
DAMAGED = (KeyError, TypeError, ValueError, IndexError, AttributeError, csv.Error,
           UnicodeDecodeError, OverflowError, ZeroDivisionError)


def check_folder(folder: Path) -> Path:
    """The folder, resolved, if it is a results folder report may write in."""
    if not folder.is_dir():
        raise SpecError(FIELD, f"{folder} is not a results folder "
                        f"({'a file' if folder.exists() else 'no such directory'})")
    real = folder.resolve()
    missing = [n for n in NEEDED if not (real / n).is_file()]
    if missing:
        raise SpecError(FIELD, f"{folder} is not a complete results folder (no "
                        f"{', '.join(missing)})")
    plots = real / "plots"
    if plots.is_symlink() or (plots.exists() and not plots.is_dir()):
        raise SpecError(FIELD, f"{plots} is not a folder inside {folder} (a link or a "
                        "file): report writes only inside the folder it is given")
    return real


def failed_reason(folder: Path) -> str | None:
    """The reason a FAILED file gives, or None for a run that completed."""
    path = folder / FAILED_FILE
    if not path.exists():
        return None
    try:
        return path.read_text(errors="replace").strip() or "no reason recorded"
    except OSError as exc:
        return f"FAILED (unreadable: {exc.strerror})"


def report(folder: Path) -> tuple[str, list[Path]]:
    """Redraw `folder`'s plots, rewrite its summary.md and summary.html; (the summary,
    the plots)."""
    real = check_folder(folder)
    with _one_line(folder):
        result = RunResult.load(real)      # of any schema version up to this code's
        topo = tomllib.loads((real / "config.toml").read_text())["topology"]
        if not isinstance(topo, dict):
            raise TypeError("config.toml's [topology] is not a table")
        reason = failed_reason(real)
        if reason is not None:        # the verdict the run wrote stays
            result = replace(result, ok=False, errors={"FAILED": reason})
        plots = draw_all(real, result.to_dict())
        pcaps = sorted((real / "pcaps").glob("*.pcap")) if (real / "pcaps").is_dir() else []
        summary = summary_md(real.name.rsplit("-", 1)[0], result, topo, pcaps)
        replace_file(real / "summary.md", lambda tmp: tmp.write_text(summary))
        write_run_page(real)
    return summary, plots


@contextmanager
def _one_line(folder: Path):
    """A file of `folder` that cannot be read or is damaged, as one SpecError line."""
    try:
        yield
    except MetricsError as exc:       # names the file and the key
        raise SpecError(FIELD, str(exc)) from None
    except OSError as exc:
        raise SpecError(FIELD, f"{folder}: {exc.filename or 'a file'} cannot be read "
                        f"({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, *DAMAGED) as exc:
        raise SpecError(FIELD, f"{folder} holds a damaged file ({type(exc).__name__}: "
                        f"{str(exc)[:200]})") from None


def is_script_folder(folder: Path) -> bool:
    """A script's (or a sweep's) folder: no run of its own (no links.csv), its runs in
    subfolders."""
    return (folder.is_dir() and not (folder / "links.csv").exists()
            and bool(run_folders(folder)))


def report_script(folder: Path) -> tuple[str, list[Path]]:
    """Each of a script's runs reported again, then its index.html; (the script's
    summary.md as it stands, the pages written)."""
    real = folder.resolve()
    pages = []
    for run in run_folders(real):
        report(run)
        pages.append(run / "summary.html")
    with _one_line(folder):
        pages.append(write_index(real))
        md = next((real / n for n in SUMMARIES if (real / n).is_file()), None)
        text = md.read_text() if md else ""
    return text, pages

