"""A generated English corpus so that training works offline, out of the box.

The machines legato is tested on have no network and no dataset, yet ``legato train`` with
the defaults must show a tiny model learning. This module generates ~3 MB of text from a
seed in about a second: a small invented world of people, towns, jobs, pets and foods, and
documents about it:

- profiles ("Mira Tolen lives in Ashford. She works as a baker. ..."),
- short stories of visits between friends that reuse the world's facts,
- question/answer drills about those facts,
- town descriptions listing their residents,
- arithmetic facts (``17 + 25 = 42``) and counting / alphabet / weekday lists.

It has structure at every scale a small model can pick up in a few hundred steps
(spelling, grammar of the templates, then facts and sums), but enough variation that it is
not memorised at once. Documents are separated by a blank line in a ``.txt`` file.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from legato.atomic import write_text_atomic

CORPUS_VERSION = 1
DEFAULT_BYTES = 3_000_000

# Word lists read better on one line each.
# fmt: off
_SYLLABLES = ("ka", "lo", "mi", "ren", "to", "sa", "vi", "nor", "el", "da", "fen", "ru", "bel", "ith", "an", "mor", "ta", "quil", "os", "dre")
_TOWN_ENDS = ("ford", "dale", "ton", "mere", "wick", "by", "stead", "holm")
_JOBS = ("baker", "farmer", "teacher", "sailor", "miller", "weaver", "smith", "doctor", "painter", "fisher", "potter", "builder")
_ANIMALS = ("cat", "dog", "horse", "goat", "owl", "fox", "rabbit", "duck", "pig", "crow")
_COLORS = ("red", "brown", "black", "white", "grey", "golden", "spotted", "green")
_FOODS = ("apples", "plums", "pears", "figs", "nuts", "carrots", "onions", "eggs", "buns", "cakes", "beans", "cherries")
_PLACES = ("market", "river", "bridge", "mill", "forest", "hill", "harbour", "garden", "school", "well")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# fmt: on
_PRONOUNS = {"she": ("She", "her"), "he": ("He", "his"), "they": ("They", "their")}


@dataclass(frozen=True)
class Person:
    name: str
    town: str
    job: str
    animal: str
    color: str
    pet: str
    food: str
    age: int
    pronoun: str
    friend: str


def _word(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _unique_words(rng: random.Random, count: int, make) -> list[str]:
    words: list[str] = []
    while len(words) < count:
        word = make()
        if word not in words:
            words.append(word)
    return words


def make_world(rng: random.Random, people: int = 48, towns: int = 10) -> list[Person]:
    """Invent the people of the corpus; every document draws its facts from this list."""
    town_names = _unique_words(rng, towns, lambda: _word(rng, 1) + rng.choice(_TOWN_ENDS))
    names = _unique_words(rng, people, lambda: _word(rng, rng.choice((2, 2, 3))))
    pets = _unique_words(rng, people, lambda: _word(rng, rng.choice((1, 2))))
    return [
        Person(
            name=name,
            town=rng.choice(town_names),
            job=rng.choice(_JOBS),
            animal=rng.choice(_ANIMALS),
            color=rng.choice(_COLORS),
            pet=pets[i],
            food=rng.choice(_FOODS),
            age=rng.randint(18, 80),
            pronoun=rng.choice(tuple(_PRONOUNS)),
            friend=names[(i + rng.randint(1, people - 1)) % people],
        )
        for i, name in enumerate(names)
    ]


def _verb(p: Person, singular: str, plural: str) -> str:
    return plural if p.pronoun == "they" else singular


def _profile(rng: random.Random, p: Person, world: dict[str, Person]) -> str:
    subj, poss = _PRONOUNS[p.pronoun]
    facts = [
        f"{subj} {_verb(p, 'works', 'work')} as a {p.job}.",
        f"{p.name} has a {p.color} {p.animal} named {p.pet}.",
        f"{poss.capitalize()} favourite food is {p.food}.",
        f"{p.name} is {p.age} years old.",
        f"{poss.capitalize()} best friend is {p.friend}, who lives in {world[p.friend].town}.",
    ]
    rng.shuffle(facts)
    return f"{p.name} lives in {p.town}. " + " ".join(facts[: rng.randint(3, len(facts))])


def _story(rng: random.Random, p: Person, world: dict[str, Person]) -> str:
    f = world[p.friend]
    subj, poss = _PRONOUNS[p.pronoun]
    day, place = rng.choice(_WEEKDAYS), rng.choice(_PLACES)
    gifts = rng.randint(2, 9)
    lines = [
        f"On {day}, {p.name} the {p.job} left {p.town} to visit {f.name}.",
        f"{subj} took {poss} {p.animal}, {p.pet}, and a basket of {gifts} {p.food}.",
        f"They met near the {place} in {f.town}.",
        f'"Hello, {f.name}," said {p.name}. "I brought you {p.food}."',
        f'"Thank you," said {f.name}. "My {f.animal} {f.pet} likes {p.food} too."',
    ]
    if rng.random() < 0.5:
        eaten = rng.randint(1, gifts)
        lines.append(
            f"{f.pet} ate {eaten} of the {p.food}, so {gifts - eaten} "
            f"{'was' if gifts - eaten == 1 else 'were'} left for {f.name}."
        )
    ending = rng.choice(
        (
            f"In the evening {p.name} walked home to {p.town}.",
            f"They talked until night, and {p.name} stayed in {f.town}.",
            f"Later it rained, so {p.name} waited at the {place} before going home.",
        )
    )
    return " ".join([*lines, ending])


def _questions(rng: random.Random, people: list[Person], world: dict[str, Person]) -> str:
    asks = []
    for p in rng.sample(people, rng.randint(3, 6)):
        asks += [
            (f"Where does {p.name} live?", f"{p.name} lives in {p.town}."),
            (f"What is {p.name}'s job?", f"{p.name} is a {p.job}."),
            (f"What is the name of {p.name}'s {p.animal}?", f"It is called {p.pet}."),
            (f"How old is {p.name}?", f"{p.name} is {p.age}."),
            (f"Who is {p.name}'s best friend?", f"{p.friend}, from {world[p.friend].town}."),
        ]
    return "\n".join(f"Q: {q}\nA: {a}" for q, a in rng.sample(asks, min(len(asks), 6)))


def _town(rng: random.Random, people: list[Person]) -> str:
    town = rng.choice(people).town
    residents = [p for p in people if p.town == town]
    jobs = sorted({p.job for p in residents})
    return (
        f"{town} is a small town with a {rng.choice(_PLACES)}. "
        f"People who live there: {', '.join(p.name for p in residents)}. "
        f"In {town} you can find {' and '.join(f'a {job}' for job in jobs)}."
    )


def _arithmetic(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(4, 10)):
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        op = rng.choice("+-*")
        if op == "-":
            a, b = max(a, b), min(a, b)
        if op == "*":
            a, b = a % 13, b % 13
        result = a + b if op == "+" else a - b if op == "-" else a * b
        lines.append(f"{a} {op} {b} = {result}")
    return "\n".join(lines)


def _sequence(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        start = rng.randint(0, 90)
        stop = start + rng.randint(4, 15)
        return (
            f"Counting from {start} to {stop}: " + ", ".join(map(str, range(start, stop + 1))) + "."
        )
    if kind == 1:
        start = rng.randint(5, 40)
        return f"Counting down from {start}: " + ", ".join(map(str, range(start, -1, -1))) + "."
    if kind == 2:
        first = rng.randrange(20)
        letters = [chr(ord("a") + i) for i in range(first, min(26, first + rng.randint(5, 10)))]
        return f"The letters after {letters[0]} are " + " ".join(letters[1:]) + "."
    first = rng.randrange(7)
    days = [_WEEKDAYS[(first + i) % 7] for i in range(rng.randint(3, 7))]
    return f"After {days[0]} comes " + ", then ".join(days[1:]) + "."


def generate_documents(seed: int = 0, target_bytes: int = DEFAULT_BYTES) -> list[str]:
    """The corpus as a list of documents totalling about ``target_bytes`` of UTF-8."""
    rng = random.Random(seed)
    people = make_world(rng)
    world = {p.name: p for p in people}
    docs: list[str] = []
    size = 0
    while size < target_bytes:
        kind = rng.random()
        if kind < 0.2:
            doc = _profile(rng, rng.choice(people), world)
        elif kind < 0.5:
            doc = _story(rng, rng.choice(people), world)
        elif kind < 0.65:
            doc = _questions(rng, people, world)
        elif kind < 0.72:
            doc = _town(rng, people)
        elif kind < 0.88:
            doc = _arithmetic(rng)
        else:
            doc = _sequence(rng)
        docs.append(doc)
        size += len(doc) + 2  # plus the blank line that separates documents
    return docs


def builtin_corpus_path(
    cache_dir: str | Path, *, seed: int = 0, target_bytes: int = DEFAULT_BYTES
) -> Path:
    """Write the corpus for ``seed`` into ``cache_dir`` once (atomically) and return its path."""
    path = Path(cache_dir) / f"builtin-corpus-v{CORPUS_VERSION}-seed{seed}-{target_bytes}.txt"
    if not path.is_file():
        text = "\n\n".join(generate_documents(seed, target_bytes)) + "\n"
        write_text_atomic(path, text)
    return path
