"""Write ``envhub/envs/data/gsm8k_style.jsonl``: GSM8K-format word problems made from templates.

The ``gsm8k`` env ships these so that it works offline; the real GSM8K is loaded from the Hub
when online. Each row has a ``question`` and an ``answer``: a short worked solution whose
calculations are annotated ``<<expression=value>>`` and whose last line is ``#### <number>``,
as in GSM8K. Every template draws its numbers so that each step is a whole number.

The output is a pure function of ``--seed`` and ``--count``; the test suite regenerates it and
compares it with the shipped file, so edit a template, then rerun::

    python scripts/make_gsm8k_style.py
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from envhub.envs.expressions import evaluate

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "envhub" / "envs" / "data" / "gsm8k_style.jsonl"


@dataclass(frozen=True)
class Person:
    """A name and its pronouns; the capitalised forms start sentences."""

    name: str
    he: str
    him: str
    his: str
    He: str
    His: str


def _people(names: str, he: str, him: str, his: str) -> list[Person]:
    return [Person(n, he, him, his, he.capitalize(), his.capitalize()) for n in names.split()]


PEOPLE = _people(
    "Maya Lena Sofia Priya Hannah Grace Amara Julia Nora Rosa", "she", "her", "her"
) + _people("Omar Lucas Ben Diego Kenji Samuel Tariq Felix Noah Ivan", "he", "him", "his")


@dataclass
class Solution:
    """The worked lines of one solution; each calculation is annotated like GSM8K's."""

    lines: list[str] = field(default_factory=list)
    value: int = 0

    def step(self, before: str, expression: str, after: str) -> int:
        """Add ``"<before> <expr> = <<expr=value>>value <after>"`` and return the value."""
        exact = evaluate(expression)
        if exact.denominator != 1:
            raise ValueError(f"{expression} = {exact} is not a whole number")
        self.value = int(exact)
        self.lines.append(
            f"{before} {expression} = <<{expression}={self.value}>>{self.value} {after}".strip()
        )
        return self.value

    def text(self) -> str:
        """The solution as GSM8K writes it: the worked lines, then ``#### <final value>``."""
        return "\n".join([*self.lines, f"#### {self.value}"])


Template = Callable[[random.Random, Person], tuple[str, Solution]]


def shopping_change(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Two purchases paid with the smallest $20/$50/$100 bill above the total; asks the change."""
    first, second = rng.sample(
        ["notebooks", "pens", "apples", "candles", "stickers", "mugs", "bagels"], 2
    )
    n1, n2, p1, p2 = rng.randint(2, 6), rng.randint(2, 6), rng.randint(2, 9), rng.randint(1, 5)
    bill = next(b for b in (20, 50, 100) if b > n1 * p1 + n2 * p2)
    question = (
        f"{p.name} buys {n1} {first} for ${p1} each and {n2} {second} for ${p2} each. "
        f"{p.He} pays with a ${bill} bill. How much change does {p.he} get back?"
    )
    s = Solution()
    c1 = s.step(f"The {first} cost", f"{n1}*{p1}", "dollars.")
    c2 = s.step(f"The {second} cost", f"{n2}*{p2}", "dollars.")
    total = s.step(f"{p.He} spends", f"{c1}+{c2}", "dollars in all.")
    s.step(f"{p.His} change is", f"{bill}-{total}", "dollars.")
    return question, s


def road_trip(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Two legs of a drive at different speeds; asks the total distance."""
    s1, s2 = rng.randrange(30, 75, 5), rng.randrange(30, 75, 5)
    h1, h2 = rng.randint(1, 4), rng.randint(1, 4)
    question = (
        f"{p.name} drives for {h1} hours at {s1} miles per hour and then for {h2} more hours at "
        f"{s2} miles per hour. How many miles does {p.he} drive in all?"
    )
    s = Solution()
    d1 = s.step("In the first part of the trip", f"{s1}*{h1}", "miles are driven.")
    d2 = s.step("In the second part", f"{s2}*{h2}", "miles are driven.")
    s.step(f"{p.He} drives", f"{d1}+{d2}", "miles in all.")
    return question, s


def ages(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Three people's ages, each given relative to the next; asks the sum of the three."""
    older, middle, young = p.name, *rng.sample([q.name for q in PEOPLE if q.name != p.name], 2)
    c, m, k = rng.randint(3, 12), rng.randint(2, 4), rng.randint(2, 9)
    question = (
        f"{older} is {k} years older than {middle}. {middle} is {m} times as old as {young}, "
        f"who is {c} years old. What is the sum of their three ages?"
    )
    s = Solution()
    b = s.step(f"{middle} is", f"{m}*{c}", "years old.")
    a = s.step(f"{older} is", f"{b}+{k}", "years old.")
    s.step("Together they are", f"{c}+{b}+{a}", "years old.")
    return question, s


def class_sports(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """A class split by a fraction and then by half into two sports; asks how many play neither."""
    while True:
        denominator, part = (
            rng.choice([(3, "third"), (4, "quarter"), (5, "fifth")]),
            rng.randint(4, 10),
        )
        students = denominator[0] * part
        if (students - part) % 2 == 0:
            break
    question = (
        f"{p.name}'s class has {students} students. One {denominator[1]} of them play soccer, "
        "and half of the other students play basketball. The rest play no sport. "
        "How many students play no sport?"
    )
    s = Solution()
    soccer = s.step("", f"{students}/{denominator[0]}", "students play soccer.")
    others = s.step("That leaves", f"{students}-{soccer}", "students.")
    basketball = s.step("", f"{others}/2", "students play basketball.")
    s.step("So", f"{others}-{basketball}", "students play no sport.")
    return question, s


def weekly_pay(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """An hourly wage over a week, less a fraction spent on groceries; asks what is left."""
    while True:
        wage, hours, days = rng.randint(8, 20), rng.randint(4, 8), rng.randint(3, 6)
        fits = [f for f in (2, 3, 4, 5) if wage * hours * days % f == 0]
        if fits:
            part = rng.choice(fits)
            break
    question = (
        f"{p.name} earns ${wage} an hour. {p.He} works {hours} hours a day, {days} days a week, "
        f"and spends 1/{part} of {p.his} weekly pay on groceries. "
        f"How much money does {p.he} have left each week?"
    )
    s = Solution()
    daily = s.step(f"{p.He} earns", f"{wage}*{hours}", "dollars a day.")
    weekly = s.step(f"{p.He} earns", f"{daily}*{days}", "dollars a week.")
    groceries = s.step("Groceries cost", f"{weekly}/{part}", "dollars.")
    s.step(f"{p.He} has", f"{weekly}-{groceries}", "dollars left.")
    return question, s


def recipe(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Scaling a cookie recipe by whole batches; asks the cups of flour needed."""
    cups, batch, batches = rng.randint(2, 5), rng.choice([12, 16, 20, 24]), rng.randint(2, 6)
    wanted = batch * batches
    question = (
        f"A recipe uses {cups} cups of flour to make {batch} cookies. "
        f"{p.name} wants to bake {wanted} cookies for a school fair. "
        f"How many cups of flour does {p.he} need?"
    )
    s = Solution()
    count = s.step(f"{p.He} needs to make", f"{wanted}/{batch}", "batches.")
    s.step(f"{p.He} needs", f"{count}*{cups}", "cups of flour.")
    return question, s


def savings_goal(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Savings so far plus a weekly amount toward a price; asks the number of weeks."""
    thing = rng.choice(["bike", "guitar", "tablet", "telescope", "skateboard", "camera"])
    weeks, weekly, saved = rng.randint(3, 12), rng.randrange(5, 30, 5), rng.randrange(10, 105, 5)
    price = saved + weeks * weekly
    question = (
        f"{p.name} is saving for a {thing} that costs ${price}. "
        f"{p.He} already has ${saved} and saves ${weekly} every week. "
        f"How many weeks will it take {p.him} to have enough money?"
    )
    s = Solution()
    missing = s.step(f"{p.He} still needs", f"{price}-{saved}", "dollars.")
    s.step("It will take", f"{missing}/{weekly}", "weeks.")
    return question, s


def discount(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """A percentage discount on an item bought several times; asks the total paid."""
    one, many = rng.choice(
        [
            ("backpack", "backpacks"),
            ("lamp", "lamps"),
            ("jacket", "jackets"),
            ("board game", "board games"),
        ]
    )
    price, percent, count = (
        rng.randrange(20, 220, 20),
        rng.choice([10, 20, 25, 50]),
        rng.randint(2, 5),
    )
    question = (
        f"A {one} usually costs ${price}. This week it is {percent}% off. "
        f"{p.name} buys {count} {many}. How much does {p.he} pay?"
    )
    s = Solution()
    off = s.step("The discount is", f"{price}*{percent}/100", "dollars.")
    sale = s.step(f"Each {one} costs", f"{price}-{off}", "dollars.")
    s.step(f"{p.He} pays", f"{sale}*{count}", "dollars.")
    return question, s


def sharing_fruit(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Fruit picked, shared out equally among friends and partly eaten; asks how much is left."""
    fruit = rng.choice(["apples", "plums", "strawberries", "cherries", "oranges"])
    each, friends, eaten = rng.randint(2, 5), rng.randint(3, 6), rng.randint(1, 4)
    picked = each * friends + eaten + rng.randint(3, 30)
    question = (
        f"{p.name} picks {picked} {fruit}. "
        f"{p.He} gives {each} {fruit} to each of {p.his} {friends} friends "
        f"and then eats {eaten} {fruit}. How many {fruit} does {p.he} have left?"
    )
    s = Solution()
    given = s.step(f"{p.He} gives away", f"{each}*{friends}", f"{fruit}.")
    gone = s.step("In all", f"{given}+{eaten}", f"{fruit} are gone.")
    s.step(f"{p.He} has", f"{picked}-{gone}", f"{fruit} left.")
    return question, s


def garden_boxes(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Rows of tomato plants whose harvest is packed into boxes; asks the boxes filled."""
    while True:
        rows, per_row, each = rng.randint(3, 8), rng.randint(4, 10), rng.randint(2, 6)
        fits = [b for b in (4, 5, 6, 8, 10, 12) if rows * per_row * each % b == 0]
        if fits:
            box = rng.choice(fits)
            break
    question = (
        f"{p.name}'s garden has {rows} rows with {per_row} tomato plants in each row. "
        f"Each plant grows {each} tomatoes. {p.He} packs the tomatoes in boxes of {box}. "
        f"How many boxes does {p.he} fill?"
    )
    s = Solution()
    plants = s.step("There are", f"{rows}*{per_row}", "plants.")
    tomatoes = s.step("They grow", f"{plants}*{each}", "tomatoes.")
    s.step(f"{p.He} fills", f"{tomatoes}/{box}", "boxes.")
    return question, s


def reading(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """A book read over Monday, Tuesday (twice Monday) and then a fixed rate; asks the days left."""
    monday, daily, days = rng.randint(10, 30), rng.randint(5, 20), rng.randint(2, 8)
    pages = monday * 3 + daily * days
    question = (
        f"{p.name}'s book has {pages} pages. "
        f"{p.He} reads {monday} pages on Monday and twice as many on Tuesday. "
        f"If {p.he} then reads {daily} pages a day, "
        f"how many more days will {p.he} need to finish the book?"
    )
    s = Solution()
    tuesday = s.step(f"On Tuesday {p.he} reads", f"{monday}*2", "pages.")
    read = s.step(f"{p.He} has read", f"{monday}+{tuesday}", "pages.")
    left = s.step("There are", f"{pages}-{read}", "pages left.")
    s.step(f"{p.He} needs", f"{left}/{daily}", "more days.")
    return question, s


def leaky_tank(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """A tank filled by a hose while it leaks; asks the minutes to fill it."""
    inflow = rng.randint(6, 15)
    leak, minutes = rng.randint(1, inflow - 2), rng.randint(5, 30)
    capacity = (inflow - leak) * minutes
    question = (
        f"{p.name} fills an empty tank that holds {capacity} liters. "
        f"The hose pours in {inflow} liters per minute, but a crack lets {leak} liters leak out "
        "each minute. How many minutes does it take to fill the tank?"
    )
    s = Solution()
    net = s.step("The tank gains", f"{inflow}-{leak}", "liters each minute.")
    s.step("It takes", f"{capacity}/{net}", "minutes.")
    return question, s


def bake_sale(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Cake and pie sales less the cost of ingredients; asks the profit."""
    cakes, cake_price, pies, pie_price = (
        rng.randint(5, 20),
        rng.randint(8, 20),
        rng.randint(4, 15),
        rng.randint(5, 12),
    )
    revenue = cakes * cake_price + pies * pie_price
    costs = rng.randint(revenue // 4, revenue // 2)
    question = (
        f"At a bake sale, {p.name} sells {cakes} cakes for ${cake_price} each "
        f"and {pies} pies for ${pie_price} each. "
        f"The ingredients cost {p.him} ${costs}. How much profit does {p.he} make?"
    )
    s = Solution()
    from_cakes = s.step("The cakes bring in", f"{cakes}*{cake_price}", "dollars.")
    from_pies = s.step("The pies bring in", f"{pies}*{pie_price}", "dollars.")
    income = s.step(f"{p.He} takes in", f"{from_cakes}+{from_pies}", "dollars.")
    s.step(f"{p.His} profit is", f"{income}-{costs}", "dollars.")
    return question, s


def running(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Miles run on weekdays and on weekend days; asks the total over several weeks."""
    weekday, weekend, weeks = rng.randint(2, 6), rng.randint(3, 10), rng.randint(2, 6)
    question = (
        f"{p.name} runs {weekday} miles every weekday "
        f"and {weekend} miles on each day of the weekend. "
        f"How many miles does {p.he} run in {weeks} weeks?"
    )
    s = Solution()
    workdays = s.step("On weekdays", f"{weekday}*5", "miles.")
    weekends = s.step("On the weekend", f"{weekend}*2", "miles.")
    week = s.step("Each week", f"{workdays}+{weekends}", "miles.")
    s.step(f"In {weeks} weeks", f"{week}*{weeks}", "miles.")
    return question, s


def town_bikes(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """A town's adults (people less a percentage of children); asks how many bike to work."""
    while True:
        people, percent = rng.randrange(200, 2100, 100), rng.randrange(10, 70, 10)
        adults = people - people * percent // 100
        fits = [d for d in (2, 4, 5) if adults % d == 0]
        if fits:
            part = rng.choice(fits)
            break
    question = (
        f"{p.name}'s town has {people} people. "
        f"{percent}% of them are children, and 1/{part} of the adults "
        "ride a bike to work. How many adults ride a bike to work?"
    )
    s = Solution()
    children = s.step("There are", f"{people}*{percent}/100", "children.")
    grown = s.step("There are", f"{people}-{children}", "adults.")
    s.step("So", f"{grown}/{part}", "adults ride a bike to work.")
    return question, s


def pizza_party(rng: random.Random, p: Person) -> tuple[str, Solution]:
    """Slices eaten by the guests, in 8-slice pizzas at a price each; asks the total spent."""
    while True:
        guests, slices, price = rng.randint(4, 24), rng.randint(2, 4), rng.randint(9, 16)
        if guests * slices % 8 == 0:
            break
    question = (
        f"{p.name} orders pizza for {guests} people. "
        f"Each person eats {slices} slices, and every pizza is cut into 8 slices. "
        f"If a pizza costs ${price}, how much does {p.he} spend on pizza?"
    )
    s = Solution()
    total_slices = s.step("They eat", f"{guests}*{slices}", "slices.")
    pizzas = s.step(f"{p.He} needs", f"{total_slices}/8", "pizzas.")
    s.step(f"{p.He} spends", f"{pizzas}*{price}", "dollars.")
    return question, s


TEMPLATES: list[Template] = [
    shopping_change,
    road_trip,
    ages,
    class_sports,
    weekly_pay,
    recipe,
    savings_goal,
    discount,
    sharing_fruit,
    garden_boxes,
    reading,
    leaky_tank,
    bake_sale,
    running,
    town_bikes,
    pizza_party,
]


def generate(count: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """``count`` distinct problems, cycling through the templates."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(rows) < count:
        template = TEMPLATES[len(rows) % len(TEMPLATES)]
        question, solution = template(rng, rng.choice(PEOPLE))
        if question not in seen:
            seen.add(question)
            rows.append({"question": question, "answer": solution.text()})
    return rows


def to_jsonl(rows: list[dict[str, str]]) -> str:
    """The rows as JSON Lines, one object per line, non-ASCII characters kept as they are."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main() -> None:
    """Generate ``--count`` problems from ``--seed`` and write them to ``--out`` as JSONL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="number of problems")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSONL file to write")
    args = parser.parse_args()
    args.out.write_text(to_jsonl(generate(args.count, args.seed)), encoding="utf-8")
    print(f"wrote {args.count} problems to {args.out}")


if __name__ == "__main__":
    main()
