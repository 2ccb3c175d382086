"""Seeded hostile payloads for the exposition parser: mutated real captures and pathological shapes.

Shared by tests/collectors/test_exposition_fuzz.py and bench/fuzz_parse.py, so the bench measures
exactly what CI bounds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
SEEDS = sorted(FIXTURES.glob("*.txt")) + sorted((FIXTURES / "hostile").glob("*.txt"))
ODD_NUMBERS = ["1e400", "-1e400", "1e307", "nan", "NaN", "inf", "-Inf", "+Inf", str(2**63), str(-2**63),
               str(2**63 - 1), "-0", "0x10", "1_000", "1e20", "", "--1", "1e", ".", "9" * 400]
EOF_VARIANTS = ["# EOF", "# EOF ", "#EOF", "# eof", "# EOF\n# EOF", "# EOF\nafter 1", "# EOF\n\n"]


def _lines(text: str) -> list[str]:
    return text.split("\n")


def flip_bytes(rng: random.Random, text: str) -> str:
    data = bytearray(text.encode())
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)  # invalid UTF-8 included
    return data.decode("utf-8", errors="replace")  # as the collector decodes a body


def truncate(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(len(text))]


def odd_number(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    parts = lines[i].split(" ")
    if len(parts) >= 2 and not lines[i].startswith("#"):
        parts[rng.randrange(1, len(parts))] = rng.choice(ODD_NUMBERS)
        if rng.random() < 0.5:
            parts.append(rng.choice(ODD_NUMBERS))  # as a timestamp
        lines[i] = " ".join(parts)
    return "\n".join(lines)


def long_blanks(rng: random.Random, text: str) -> str:
    pos = rng.randrange(len(text))
    return text[:pos] + rng.choice([" ", "\t", " \t"]) * rng.randint(100, 5000) + text[pos:]


def duplicate_label(rng: random.Random, text: str) -> str:
    return text.replace('engine="0"', 'engine="0",engine="1"', rng.randint(1, 3))


def duplicate_series(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    return "\n".join(lines[: i + 1] + [lines[i]] * rng.randint(1, 3) + lines[i + 1:])


def eof_variant(rng: random.Random, text: str) -> str:
    body = text.replace("# EOF\n", "").rstrip("\n")
    return body + "\n" + rng.choice(EOF_VARIANTS) + rng.choice(["", "\n"])


def special_chars(rng: random.Random, text: str) -> str:
    pos = rng.randrange(len(text))
    return text[:pos] + rng.choice(['"', "\\", "{", "}", ",", "=", "#", "\r", "\x00", "\\\\\\", '\\"']) + text[pos:]


MUTATIONS: list[Callable[[random.Random, str], str]] = [
    flip_bytes, truncate, odd_number, long_blanks, duplicate_label, duplicate_series, eof_variant,
    special_chars]


def payloads(seed: int, count: int) -> Iterator[tuple[str, str]]:
    """`count` (mutation names, payload) pairs, the same for the same seed; 1-3 mutations each."""
    rng = random.Random(seed)
    texts = [(p.name, p.read_text()) for p in SEEDS]
    for _ in range(count):
        name, text = rng.choice(texts)
        applied = []
        for _ in range(rng.randint(1, 3)):
            mutate = rng.choice(MUTATIONS)
            if text:
                text = mutate(rng, text)
            applied.append(mutate.__name__)
        yield f"{name}:{'+'.join(applied)}", text


# Pathological shapes, each a function of a size n (characters): parse time must grow linearly in n.
SHAPES: dict[str, Callable[[int], str]] = {
    "blanks inside labels": lambda n: 'a{x="1"' + " " * n + ";} 1\n",
    "blanks before '='": lambda n: "a{x" + " " * n + "} 1\n",
    "unclosed label value": lambda n: 'a{x="' + "y" * n + "\n",
    "backslashes in a value": lambda n: 'a{x="' + "\\" * n + '"} 1\n',
    "many pairs, no '}'": lambda n: "a{" + 'x="",' * (n // 5) + "\n",
    # a timestamp sends the line down the slow path, which finds the '}' past quoted values
    "many quoted values, '}' at the end (OpenMetrics)": lambda n: "a{" + ",".join(f'x{i}=""' for i in range(n // 8)) + "} 1 1.5\n# EOF\n",
    "many commas": lambda n: 'a{x="1"' + "," * n + "} 1\n",
    "long metric name": lambda n: "a" * n + " 1\n",
    "long value": lambda n: "a " + "9" * n + "\n",
    "many short lines": lambda n: "a 1\n" * (n // 4),
    "many blank lines and comments": lambda n: "#\n\n" * (n // 3),
}
