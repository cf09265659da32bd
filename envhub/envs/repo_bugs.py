"""Small Python projects with a planted bug, generated from a seed (for ``repo-repair``).

``make_project(seed, difficulty)`` builds a package and its pytest suite, then plants a bug:

- difficulty 1: an off-by-one or a wrong bound in one function, whose test fails;
- difficulty 2: a wrong condition in a helper module, seen only through the failing tests of
  another module that calls it (the model has to follow the call);
- difficulty 3: two bugs in two modules; every test passes only once both are fixed.

Everything is a pure function of ``(seed, difficulty)``: ``random.Random`` seeded with a
string (hashed with SHA-512, independently of ``PYTHONHASHSEED``) picks the template, the
package's name and the numbers in the tests; expected values are computed here, from the
correct code's logic. Each plant is an exact snippet that occurs once in the correct file, so
the reference fix is the correct files themselves.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

DIFFICULTIES = (1, 2, 3)
_NAMES = (
    "ledger", "harbor", "orchard", "beacon", "quarry", "meadow", "lantern", "summit",
    "cobalt", "thistle", "juniper", "granite", "willow", "falcon", "pebble", "saffron",
)  # fmt: skip


@dataclass(frozen=True)
class Plant:
    """One planted bug: ``correct`` (which occurs exactly once in ``path``) became ``buggy``."""

    path: str
    correct: str
    buggy: str


@dataclass(frozen=True)
class Project:
    """A generated repository: the buggy files the model starts from and the fix."""

    package: str
    difficulty: int
    template: str
    correct_files: dict[str, str]
    plants: tuple[Plant, ...]
    test_count: int
    """Test functions in the suite (the verifier requires exactly this many to pass)."""
    files: dict[str, str] = field(init=False)
    """The starting repository: ``correct_files`` with every plant applied."""

    def __post_init__(self) -> None:
        files = dict(self.correct_files)
        for plant in self.plants:
            text = files[plant.path]
            if text.count(plant.correct) != 1:
                raise AssertionError(f"{self.template}: plant not unique in {plant.path}")
            files[plant.path] = text.replace(plant.correct, plant.buggy)
        object.__setattr__(self, "files", files)

    @property
    def fix(self) -> dict[str, str]:
        """The files the reference fix rewrites, with their correct contents."""
        return {p.path: self.correct_files[p.path] for p in self.plants}

    @property
    def test_files(self) -> dict[str, str]:
        """The suite (restored before the verifier runs, so editing it gains nothing)."""
        return {k: v for k, v in self.correct_files.items() if k.startswith("tests/")}


def _suite(package: str, module: str, names: str, cases: list[str]) -> str:
    body = "\n\n".join(cases)
    return f"from {package}.{module} import {names}\n\n\n{body}"


def _test(name: str, *lines: str) -> str:
    return f"def test_{name}():\n" + "".join(f"    {line}\n" for line in lines)


# -- difficulty 1: one function -------------------------------------------------------------


def _window_sums(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    k = rng.randint(2, 4)
    xs = [rng.randint(-9, 30) for _ in range(rng.randint(k + 2, k + 5))]
    sums = [sum(xs[i : i + k]) for i in range(len(xs) - k + 1)]
    code = (
        '"""Sliding-window arithmetic."""\n\n\n'
        "def window_sums(xs, k):\n"
        '    """The sum of every run of k consecutive items, in order."""\n'
        "    return [sum(xs[i : i + k]) for i in range(len(xs) - k + 1)]\n"
    )
    tests = _suite(
        pkg,
        "windows",
        "window_sums",
        [
            _test("window_sums", f"assert window_sums({xs}, {k}) == {sums}"),
            _test(
                "window_as_long_as_the_list",
                f"assert window_sums({xs[:k]}, {k}) == [{sum(xs[:k])}]",
            ),
            _test("window_longer_than_the_list", f"assert window_sums([1], {k}) == []"),
        ],
    )
    plant = Plant(f"{pkg}/windows.py", "len(xs) - k + 1", "len(xs) - k")
    return {f"{pkg}/windows.py": code, "tests/test_windows.py": tests}, [plant], 3


def _count_between(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    lo = rng.randint(0, 10)
    hi = lo + rng.randint(3, 8)
    xs = [lo, hi, lo - 1, hi + 1, *(rng.randint(lo, hi) for _ in range(3))]
    rng.shuffle(xs)
    inside = sum(lo <= x <= hi for x in xs)
    code = (
        '"""Counting readings in a range."""\n\n\n'
        "def count_between(xs, lo, hi):\n"
        '    """How many items lie between lo and hi, both ends included."""\n'
        "    return sum(1 for x in xs if lo <= x <= hi)\n"
    )
    tests = _suite(
        pkg,
        "ranges",
        "count_between",
        [
            _test("count_between", f"assert count_between({xs}, {lo}, {hi}) == {inside}"),
            _test("empty", f"assert count_between([], {lo}, {hi}) == 0"),
        ],
    )
    plant = Plant(f"{pkg}/ranges.py", "lo <= x <= hi", "lo <= x < hi")
    return {f"{pkg}/ranges.py": code, "tests/test_ranges.py": tests}, [plant], 2


def _page_count(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    per_page = rng.randint(3, 12)
    exact = per_page * rng.randint(2, 6)
    ragged = exact + rng.randint(1, per_page - 1)
    code = (
        '"""Pagination."""\n\n\n'
        "def page_count(total, per_page):\n"
        '    """Pages needed to show `total` items, `per_page` to a page."""\n'
        "    return (total + per_page - 1) // per_page\n"
    )
    tests = _suite(
        pkg,
        "pages",
        "page_count",
        [
            _test(
                "ragged_last_page",
                f"assert page_count({ragged}, {per_page}) == {-(-ragged // per_page)}",
            ),
            _test(
                "full_last_page", f"assert page_count({exact}, {per_page}) == {exact // per_page}"
            ),
            _test("no_items", f"assert page_count(0, {per_page}) == 0"),
        ],
    )
    plant = Plant(f"{pkg}/pages.py", "(total + per_page - 1) // per_page", "total // per_page + 1")
    return {f"{pkg}/pages.py": code, "tests/test_pages.py": tests}, [plant], 3


# -- difficulty 2: a helper's condition, seen through its caller ------------------------------


def _eligibility(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    limit = rng.randint(16, 21)
    ages = {"ana": limit, "bo": limit - 1, "cy": limit + rng.randint(1, 9), "di": limit - 3}
    names = sorted(n for n, a in ages.items() if a >= limit)
    rules = (
        '"""Who may sign up."""\n\n\n'
        "def is_eligible(age, minimum_age):\n"
        '    """Whether someone of `age` may sign up (the minimum age itself is allowed)."""\n'
        "    return age >= minimum_age\n"
    )
    service = (
        '"""The sign-up service."""\n\n'
        f"from {pkg}.rules import is_eligible\n\n\n"
        "def eligible_names(people, minimum_age):\n"
        '    """Names of the people who may sign up, sorted."""\n'
        "    return sorted(name for name, age in people.items() if is_eligible(age, minimum_age))\n"
    )
    tests = _suite(
        pkg,
        "service",
        "eligible_names",
        [
            _test("eligible_names", f"assert eligible_names({ages}, {limit}) == {names}"),
            _test("nobody", f"assert eligible_names({{}}, {limit}) == []"),
        ],
    )
    plant = Plant(f"{pkg}/rules.py", "age >= minimum_age", "age > minimum_age")
    files = {f"{pkg}/rules.py": rules, f"{pkg}/service.py": service, "tests/test_service.py": tests}
    return files, [plant], 2


def _leap_years(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    century = rng.choice([1700, 1800, 1900, 2100, 2200])
    quad = rng.choice([1900 + 4 * i for i in range(1, 25)])
    checks = (
        '"""Calendar rules."""\n\n\n'
        "def is_leap(year):\n"
        '    """Gregorian leap years: every 4th year, except centuries not divisible by 400."""\n'
        "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n"
    )
    calendar = (
        '"""Year lengths."""\n\n'
        f"from {pkg}.checks import is_leap\n\n\n"
        "def days_in_year(year):\n"
        '    """366 in a leap year, else 365."""\n'
        "    return 366 if is_leap(year) else 365\n"
    )
    tests = _suite(
        pkg,
        "calendar",
        "days_in_year",
        [
            _test("leap_year", f"assert days_in_year({quad}) == 366"),
            _test("common_year", f"assert days_in_year({quad + 1}) == 365"),
            _test("century", f"assert days_in_year({century}) == 365"),
            _test("fourth_century", "assert days_in_year(2000) == 366"),
        ],
    )
    plant = Plant(
        f"{pkg}/checks.py",
        "year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
        "year % 4 == 0 or year % 400 == 0",
    )
    files = {f"{pkg}/checks.py": checks, f"{pkg}/calendar.py": calendar}
    return {**files, "tests/test_calendar.py": tests}, [plant], 4


def _stock(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    items = {"bolt": rng.randint(1, 9), "nut": 0, "gear": rng.randint(1, 9), "cog": 0}
    names = sorted(n for n, q in items.items() if q > 0)
    validate = (
        '"""Stock rules."""\n\n\n'
        "def in_stock(quantity):\n"
        '    """Whether at least one unit is on the shelf."""\n'
        "    return quantity > 0\n"
    )
    orders = (
        '"""What can be ordered."""\n\n'
        f"from {pkg}.validate import in_stock\n\n\n"
        "def orderable(stock):\n"
        '    """Names of the items that can be ordered now, sorted."""\n'
        "    return sorted(name for name, quantity in stock.items() if in_stock(quantity))\n"
    )
    tests = _suite(
        pkg,
        "orders",
        "orderable",
        [
            _test("orderable", f"assert orderable({items}) == {names}"),
            _test("sold_out", 'assert orderable({"bolt": 0}) == []'),
        ],
    )
    plant = Plant(f"{pkg}/validate.py", "quantity > 0", "quantity >= 0")
    files = {f"{pkg}/validate.py": validate, f"{pkg}/orders.py": orders}
    return {**files, "tests/test_orders.py": tests}, [plant], 2


# -- difficulty 3: two bugs, two edits ----------------------------------------------------------


def _word_index(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    words = rng.sample(["Apple", "pear", "Plum", "fig", "Kiwi", "lime"], 4)
    last = rng.choice(words)
    text = " ".join([*words, last.upper()])
    counts: dict[str, int] = {}
    for word in text.split():
        counts[word.lower()] = counts.get(word.lower(), 0) + 1
    normal = (
        '"""Text clean-up."""\n\n\n'
        "def normalize(word):\n"
        '    """A word compared without case or surrounding spaces."""\n'
        "    return word.strip().lower()\n"
    )
    index = (
        '"""Word counts."""\n\n'
        f"from {pkg}.normal import normalize\n\n\n"
        "def word_counts(text):\n"
        '    """How often each (normalized) word occurs in `text`."""\n'
        "    counts = {}\n"
        "    for word in text.split():\n"
        "        key = normalize(word)\n"
        "        counts[key] = counts.get(key, 0) + 1\n"
        "    return counts\n"
    )
    tests = _suite(
        pkg,
        "index",
        "word_counts",
        [
            _test("counts", f"assert word_counts({text!r}) == {counts}"),
            _test("case_is_ignored", 'assert word_counts("Ab ab AB") == {"ab": 3}'),
            _test("last_word_counts", 'assert word_counts("x y") == {"x": 1, "y": 1}'),
        ],
    )
    plants = [
        Plant(f"{pkg}/normal.py", "word.strip().lower()", "word.strip()"),
        Plant(f"{pkg}/index.py", "for word in text.split():", "for word in text.split()[:-1]:"),
    ]
    files = {f"{pkg}/normal.py": normal, f"{pkg}/index.py": index}
    return {**files, "tests/test_index.py": tests}, plants, 3


def _cart(rng: random.Random, pkg: str) -> tuple[dict[str, str], list[Plant], int]:
    prices = [rng.randint(101, 999) / 100 for _ in range(3)]
    cents = [round(p * 100) for p in prices]
    money = (
        '"""Money in whole cents."""\n\n\n'
        "def to_cents(amount):\n"
        '    """An amount in currency units as whole cents, rounded to the nearest cent."""\n'
        "    return round(amount * 100)\n"
    )
    cart = (
        '"""Shopping cart totals."""\n\n'
        f"from {pkg}.money import to_cents\n\n\n"
        "def total_cents(prices):\n"
        '    """The sum of all prices, in cents."""\n'
        "    return sum(to_cents(prices[i]) for i in range(len(prices)))\n"
    )
    tests = _suite(
        pkg,
        "cart",
        "total_cents",
        [
            _test("total", f"assert total_cents({prices}) == {sum(cents)}"),
            _test("rounding", "assert total_cents([0.29]) == 29"),
            _test("empty_cart", "assert total_cents([]) == 0"),
        ],
    )
    plants = [
        Plant(f"{pkg}/money.py", "round(amount * 100)", "int(amount * 100)"),
        Plant(f"{pkg}/cart.py", "range(len(prices))", "range(1, len(prices))"),
    ]
    files = {f"{pkg}/money.py": money, f"{pkg}/cart.py": cart}
    return {**files, "tests/test_cart.py": tests}, plants, 3


Template = Callable[[random.Random, str], tuple[dict[str, str], list[Plant], int]]
TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (_window_sums, _count_between, _page_count),
    2: (_eligibility, _leap_years, _stock),
    3: (_word_index, _cart),
}


def make_project(seed: int, difficulty: int) -> Project:
    """The project of ``(seed, difficulty)``; the same arguments give the same bytes.

    Raises:
        ValueError: ``difficulty`` is not 1, 2 or 3.
    """
    if difficulty not in TEMPLATES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    rng = random.Random(f"repo-repair-{difficulty}-{seed}")
    template = rng.choice(TEMPLATES[difficulty])
    package = f"{rng.choice(_NAMES)}_{seed}{difficulty}"  # unique per task: the prompt names it
    files, plants, count = template(rng, package)
    files = {
        f"{package}/__init__.py": f'"""The {package} package."""\n',
        "README.md": f"# {package}\n\nRun the tests with `python -m pytest -q`.\n",
        **files,
    }
    return Project(package, difficulty, template.__name__.lstrip("_"), files, tuple(plants), count)
