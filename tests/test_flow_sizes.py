"""Flow-size distributions: the shipped CDFs parse, their exact moments agree with their
samples, and every malformed CDF is refused with a SpecError naming the field."""

from __future__ import annotations

import math
import os
import random
from itertools import pairwise
from pathlib import Path

import pytest

from topologies.spec import SpecError
from traffic import flow_sizes
from traffic.flow_sizes import DISTRIBUTIONS, FlowSizes, load, parse_points

SAMPLES = 200_000


class GridRandom(random.Random):
    """A Random whose random() walks the midpoints of n equal cells of [0, 1): a sampler
    fed this must reproduce the CDF's mean to within the grid's error, with no noise."""

    def __init__(self, n: int):
        super().__init__(0)
        self.n = n
        self.i = 0

    def random(self) -> float:
        u = (self.i + 0.5) / self.n
        self.i += 1
        return u


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_shipped_distribution_parses(name):
    d = load(name)
    assert d.name == name and d.source == DISTRIBUTIONS[name][1]
    assert d.points[0][1] == 0.0 and d.points[-1][1] == 1.0
    assert all(a <= b for (a, _), (b, _) in pairwise(d.points))
    assert all(fa <= fb for (_, fa), (_, fb) in pairwise(d.points))
    assert 0 < d.mean_bytes() < d.max_bytes
    assert d.second_moment() > d.mean_bytes() ** 2      # a spread, not one size
    # the file names where its numbers come from
    text = (flow_sizes.CDF_DIR / DISTRIBUTIONS[name][0]).read_text()
    assert "alibaba-edu/High-Precision-Congestion-Control" in text and "commit" in text


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_sampled_mean_matches_exact_mean(name):
    """200,000 seeded samples: their mean is within 2 % of the exact mean, or within four
    standard errors where the tail makes 2 % finer than the noise (the standard error
    sqrt(Var S / n) comes from the exact second moment: fb_hadoop 1.2 %, ali_storage
    1.0 %, google_rpc 5 %, websearch 0.5 %)."""
    d = load(name)
    mean = d.mean_bytes()
    stderr = math.sqrt((d.second_moment() - mean ** 2) / SAMPLES) / mean
    rng = random.Random(20240601)
    measured = sum(d.sample(rng) for _ in range(SAMPLES)) / SAMPLES
    assert measured == pytest.approx(mean, rel=max(0.02, 4 * stderr))


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_sampler_on_an_even_grid_gives_the_exact_mean(name):
    """Free of noise: u on an even grid of 200,000 points through sample() gives the
    exact mean within 2 % (truncation to whole bytes and the 1-byte floor included)."""
    d = load(name)
    rng = GridRandom(SAMPLES)
    measured = sum(d.sample(rng) for _ in range(SAMPLES)) / SAMPLES
    assert measured == pytest.approx(d.mean_bytes(), rel=0.02)


def test_websearch_mean_by_hand():
    # segment midpoint x probability, from the points of websearch.cdf:
    #   0-10k 15 %: 5,000 x 0.15 = 750         10k-20k 5 %: 15,000 x 0.05 = 750
    #   20k-30k 10 %: 25,000 x 0.10 = 2,500    30k-50k 10 %: 40,000 x 0.10 = 4,000
    #   50k-80k 13 %: 65,000 x 0.13 = 8,450    80k-200k 7 %: 140,000 x 0.07 = 9,800
    #   200k-1M 10 %: 600,000 x 0.10 = 60,000  1M-2M 10 %: 1.5M x 0.10 = 150,000
    #   2M-5M 10 %: 3.5M x 0.10 = 350,000      5M-10M 7 %: 7.5M x 0.07 = 525,000
    #   10M-30M 3 %: 20M x 0.03 = 600,000
    # sum = 1,711,250 bytes
    d = load("websearch")
    assert d.mean_bytes() == pytest.approx(1_711_250, rel=1e-12)
    assert d.max_bytes == 30_000_000
    assert d.quantile(0.5) == pytest.approx(50_000 + 30_000 * (50 - 40) / 13)


def test_second_moment_of_one_uniform_segment():
    # uniform on [1000, 3000]: E[S^2] = (1000^2 + 1000 x 3000 + 3000^2) / 3 = 13e6 / 3
    d = FlowSizes("u", ((1000.0, 0.0), (3000.0, 1.0)), "test")
    assert d.mean_bytes() == 2000
    assert d.second_moment() == pytest.approx(13e6 / 3)


def test_hpcc_file_without_comments_parses(tmp_path):
    path = tmp_path / "WebSearch_distribution.txt"
    path.write_text("0 0\n10000 15\n20000 20\n30000 30\n50000 40\n80000 53\n200000 60\n"
                    "1000000 70\n2000000 80\n5000000 90\n10000000 97\n30000000 100\n")
    d = load(str(path))
    assert d.points == load("websearch").points
    assert d.name == "WebSearch_distribution" and d.source == str(path)


def test_user_file_with_comments_blank_lines_and_an_atom(tmp_path):
    path = tmp_path / "mine.cdf"
    path.write_text("# my sizes\n\n0 0\n100 0\n100 50\n\n300 100\n")
    d = load(str(path))
    assert d.points == ((0, 0), (100, 0), (100, 0.5), (300, 1))
    assert d.mean_bytes() == pytest.approx(0.5 * 100 + 0.5 * 200)
    assert d.quantile(0.25) == 100          # inside the atom


def test_sample_is_deterministic_for_a_seed():
    d = load("fb_hadoop")
    rng_a, rng_b = random.Random(7), random.Random(7)
    a = [d.sample(rng_a) for _ in range(1000)]
    b = [d.sample(rng_b) for _ in range(1000)]
    assert a == b
    rng_c = random.Random(8)
    assert a != [d.sample(rng_c) for _ in range(1000)]
    assert all(isinstance(s, int) and s >= 1 for s in a)
    assert len(set(a)) > 100                 # not one size repeated


def test_sample_is_at_least_one_byte():
    d = FlowSizes("tiny", ((0.0, 0.0), (0.5, 0.99), (2.0, 1.0)), "test")
    rng = random.Random(3)
    assert min(d.sample(rng) for _ in range(1000)) == 1


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_quantile_and_buckets_are_monotone(name):
    d = load(name)
    qs = [d.quantile(k / 1000) for k in range(1001)]
    assert all(a <= b for a, b in pairwise(qs))
    assert qs[0] == d.points[0][0] and qs[-1] == d.max_bytes
    edges = d.buckets()
    assert edges == sorted(set(edges)) and edges[0] > 0 and edges[-1] < d.max_bytes
    assert 5 <= len(edges) <= 9
    assert d.buckets(n=4) == sorted(set(d.buckets(n=4)))


def test_buckets_drop_repeated_edges():
    d = FlowSizes("two", ((1000.0, 0.0), (1000.0, 0.5), (3000.0, 0.5), (3000.0, 1.0)), "t")
    assert d.buckets() == [1000]            # the 10..50 % points are 1000, 60..90 % are 3000
    with pytest.raises(ValueError):
        d.quantile(1.5)


def test_unknown_name_lists_the_shipped_ones():
    with pytest.raises(SpecError) as err:
        load("websearh")
    assert err.value.field == "flows.sizes"
    assert "did you mean 'websearch'" in str(err.value)
    assert all(name in str(err.value) for name in DISTRIBUTIONS)
    with pytest.raises(SpecError) as err:
        load(3, field="rpc.sizes")
    assert err.value.field == "rpc.sizes"


BAD_FILES = [
    ("", "no points"),
    ("# only a comment\n\n", "no points"),
    ("0 0\n100 fifty\n", "not two numbers"),
    ("0 0\n100\n", "not two numbers"),
    ("0 0\n100 50 7\n", "not two numbers"),
    ("0 0\n200 50\n100 100\n", "sizes must not decrease"),
    ("0 0\n100 60\n200 50\n300 100\n", "percents must not decrease"),
    ("0 0\n100 50\n200 99\n", "must end at 100"),
    ("0 0\n-5 50\n200 100\n", "must be >= 0"),
    ("0 0\nnan 50\n200 100\n", "finite"),
    ("0 0\n100 nan\n200 100\n", "finite"),
    ("0 0\ninf 100\n", "finite"),
    ("0 0\n2000000000 100\n", "above 1 GiB"),
    ("0 0\n100 150\n", "above 100"),
    ("0 10\n100 100\n", "first point must be at 0 percent"),
    ("0 0\n0 100\n", "at least 1"),
]


@pytest.mark.parametrize("text, words", BAD_FILES)
def test_bad_cdf_file_is_refused(tmp_path, text, words):
    path = tmp_path / "bad.cdf"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load(str(path), field="flows.sizes")
    assert err.value.field == "flows.sizes"
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_too_many_lines_is_refused(tmp_path):
    path = tmp_path / "long.cdf"
    path.write_text("# x\n" * flow_sizes.MAX_LINES + "0 0\n1 100\n")
    with pytest.raises(SpecError, match="more than 100,000") as err:
        load(str(path))
    assert err.value.field == "flows.sizes"
    ok = tmp_path / "just.cdf"
    ok.write_text("# x\n" * (flow_sizes.MAX_LINES - 2) + "0 0\n1 100\n")
    assert load(str(ok)).max_bytes == 1


def test_unreadable_paths_are_refused(tmp_path):
    fifo = tmp_path / "fifo.cdf"
    os.mkfifo(fifo)                          # opening it would block: refused from its stat
    binary = tmp_path / "binary.cdf"
    binary.write_bytes(b"\xff\xfe\x00 0\n")
    huge = tmp_path / "huge.cdf"
    huge.write_bytes(b"#" * (flow_sizes.MAX_FILE_BYTES + 1))
    cases = [(tmp_path / "missing.cdf", "no such file"), (tmp_path, "is a directory"),
             (fifo, "is a FIFO, not a regular file"), (Path("/dev/zero"), "character device"),
             (binary, "is not UTF-8 text"), (huge, "is larger than"),
             ("bad\0name.cdf", "is not a file name")]
    for spec, words in cases:
        with pytest.raises(SpecError) as err:
            load(str(spec))
        assert err.value.field == "flows.sizes"
        assert words in str(err.value) and "\n" not in str(err.value)


def test_parse_points_names_the_line():
    with pytest.raises(SpecError, match=r"x line 4: .*sizes must not decrease"):
        parse_points(["0 0\n", "# c\n", "5 50\n", "4 100\n"], "x", "f")


def test_docs_table_matches_the_files():
    """docs/flows.md's table of the shipped distributions is what the files give."""
    doc = (flow_sizes.CDF_DIR.parent.parent / "docs" / "flows.md").read_text()
    doc = doc.split("## Shipped distributions", 1)[1].split("\n## ", 1)[0]
    rows = {cells[0].strip("`"): cells for line in doc.splitlines()
            if line.startswith("| `")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert set(rows) == set(DISTRIBUTIONS)
    for name, cells in rows.items():
        d = load(name)
        figures = [d.mean_bytes(), d.quantile(0.5), d.quantile(0.99), d.max_bytes,
                   len(d.points)]
        assert cells[1] == f"`{DISTRIBUTIONS[name][0]}`"
        assert cells[2:] == [f"{x:,.0f}" for x in figures]
