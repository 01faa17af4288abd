"""Message sizes as nccl-tests takes them: one size, or a sweep of sizes (pure data).

    4096, "64K", "1M"          one size in bytes; K, M, G are KiB, MiB, GiB (binary)
    "1K:64M:x2"                a sweep BEGIN:END:FACTOR: 1 KiB, 2 KiB, 4 KiB ... 64 MiB
    "64K:256K:+64K"            a sweep BEGIN:END:+STEP: 64 KiB, 128 KiB, 192 KiB, 256 KiB

as nccl-tests' -b (begin), -e (end), -f (factor) and -i (step): sizes from BEGIN while
they are at most END, each the one before times FACTOR (a whole number > 1) or plus STEP
(> 0). A sweep has at most MAX_SWEEP_SIZES sizes. Malformed text is a SpecError naming
the setting and the allowed form.
"""

from __future__ import annotations

import re

from topologies.spec import SpecError

SUFFIX_BYTES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
SIZE_RE = re.compile(r"\A([0-9]+)([KMG]?)\Z", re.IGNORECASE)
MAX_SWEEP_SIZES = 32
FORM = ('a size in bytes (K, M, G: KiB, MiB, GiB), or a sweep "BEGIN:END:xFACTOR" or '
        '"BEGIN:END:+STEP", e.g. "1K:64M:x2"')


def is_sweep(value) -> bool:
    """A sweep's text (BEGIN:END:...), not one size."""
    return isinstance(value, str) and ":" in value


def parse_size(field: str, text: str) -> int:
    """Bytes of a size such as 4096, 64K, 1M (binary suffixes)."""
    m = SIZE_RE.match(text.strip())
    if not m:
        raise SpecError(field, f"{text!r} is not {FORM}")
    return int(m.group(1)) * SUFFIX_BYTES[m.group(2).upper()]


def parse_sizes(field: str, value) -> list[int]:
    """The sizes `value` stands for, ascending: [value] for one size (an integer or a
    size's text), every size of a sweep. Only the form is checked here: the sizes' own
    limits are the setting's (testbed.experiment)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SpecError(field, f"{value!r} is not {FORM}")
    if isinstance(value, int):
        return [value]
    if not is_sweep(value):
        return [parse_size(field, value)]
    parts = value.split(":")
    if len(parts) != 3:
        raise SpecError(field, f"{value!r} is not {FORM}")
    begin, end = parse_size(field, parts[0]), parse_size(field, parts[1])
    step_text = parts[2].strip()
    if begin < 1:
        raise SpecError(field, f"{value!r}: the first size must be at least 1 B; allowed: {FORM}")
    if begin > end:
        raise SpecError(field, f"{value!r}: the first size {begin} B is more than the "
                        f"last {end} B; allowed: {FORM}")
    factor, step = 1, 0          # each size: the one before x factor + step
    if step_text[:1].lower() == "x":
        if not step_text[1:].isdigit() or int(step_text[1:]) < 2:
            raise SpecError(field, f"{value!r}: the factor must be a whole number > 1; "
                            f"allowed: {FORM}")
        factor = int(step_text[1:])
    elif step_text[:1] == "+":
        step = parse_size(field, step_text[1:])
        if step < 1:
            raise SpecError(field, f"{value!r}: the step must be > 0; allowed: {FORM}")
    else:
        raise SpecError(field, f"{value!r} is not {FORM}")
    sizes = [begin]
    while sizes[-1] * factor + step <= end:
        sizes.append(sizes[-1] * factor + step)
        if len(sizes) > MAX_SWEEP_SIZES:
            raise SpecError(field, f"{value!r} has more than {MAX_SWEEP_SIZES} sizes: a "
                            "larger factor or step, or a narrower range")
    return sizes


def size_text(size_bytes: int) -> str:
    """A size as it is written: 65536 -> "64K", 1536 -> "1536" (the largest suffix that
    divides it)."""
    for suffix in ("G", "M", "K"):
        unit = SUFFIX_BYTES[suffix]
        if size_bytes >= unit and size_bytes % unit == 0:
            return f"{size_bytes // unit}{suffix}"
    return str(size_bytes)
