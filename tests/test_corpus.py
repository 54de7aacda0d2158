"""The generated default corpus: correct German numbers, dates and word order; deterministic; disjoint splits."""

import random
import re

import pytest

from training.data import corpus
from training.data.corpus import (
    default_corpus,
    english_number,
    english_ordinal,
    english_ordinal_digits,
    english_year,
    german_number,
    german_ordinal_stem,
    german_year,
)

# Convention (see training/data/corpus.py): a leading one before hundert/tausend is left out, an inner one is kept.
GERMAN_NUMBERS = {
    0: "null",
    1: "eins",
    2: "zwei",
    6: "sechs",
    7: "sieben",
    11: "elf",
    12: "zwölf",
    16: "sechzehn",
    17: "siebzehn",
    20: "zwanzig",
    21: "einundzwanzig",
    30: "dreißig",
    31: "einunddreißig",
    60: "sechzig",
    66: "sechsundsechzig",
    70: "siebzig",
    77: "siebenundsiebzig",
    99: "neunundneunzig",
    100: "hundert",
    101: "hunderteins",
    111: "hundertelf",
    121: "hunderteinundzwanzig",
    200: "zweihundert",
    342: "dreihundertzweiundvierzig",
    999: "neunhundertneunundneunzig",
    1000: "tausend",
    1001: "tausendeins",
    1100: "tausendeinhundert",
    1971: "tausendneunhunderteinundsiebzig",
    2024: "zweitausendvierundzwanzig",
    2300: "zweitausenddreihundert",
    10000: "zehntausend",
    21000: "einundzwanzigtausend",
    100000: "hunderttausend",
    101000: "hunderteintausend",
    123456: "hundertdreiundzwanzigtausendvierhundertsechsundfünfzig",
    999999: "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
    1000000: "eine Million",
    2000000: "zwei Millionen",
    2300000: "zwei Millionen dreihunderttausend",
    21000000: "einundzwanzig Millionen",
}


@pytest.mark.parametrize(("n", "word"), GERMAN_NUMBERS.items())
def test_german_number(n, word):
    assert german_number(n) == word


@pytest.mark.parametrize(("n", "word"), [(1, "ein"), (21, "einundzwanzig"), (101, "hundertein"), (1001, "tausendein")])
def test_german_number_before_a_noun_ends_in_ein(n, word):
    assert german_number(n, final=False) == word


@pytest.mark.parametrize(
    ("year", "word"),
    [
        (1971, "neunzehnhunderteinundsiebzig"),
        (1900, "neunzehnhundert"),
        (1905, "neunzehnhundertfünf"),
        (1801, "achtzehnhunderteins"),
        (2000, "zweitausend"),
        (2001, "zweitausendeins"),
        (2024, "zweitausendvierundzwanzig"),
    ],
)
def test_german_year(year, word):
    assert german_year(year) == word


@pytest.mark.parametrize(
    ("n", "british", "words"),
    [
        (21, False, "twenty-one"),
        (342, False, "three hundred forty-two"),
        (342, True, "three hundred and forty-two"),
        (1005, True, "one thousand and five"),
        (12500, False, "twelve thousand five hundred"),
        (2300000, False, "two million three hundred thousand"),
    ],
)
def test_english_number(n, british, words):
    assert english_number(n, british=british) == words


def test_english_years_and_ordinals():
    assert english_year(1971) == "nineteen seventy-one"
    assert english_year(1905) == "nineteen oh five"
    assert english_year(1900) == "nineteen hundred"
    assert english_year(2024, style=0) == "two thousand twenty-four"
    assert english_year(2024, style=1) == "twenty twenty-four"
    assert english_year(2005, style=1) == "two thousand five"
    assert [english_ordinal(n) for n in (1, 2, 3, 12, 20, 21, 30, 31)] == [
        "first", "second", "third", "twelfth", "twentieth", "twenty-first", "thirtieth", "thirty-first"
    ]  # fmt: skip
    assert [english_ordinal_digits(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "31st"
    ]  # fmt: skip
    assert [german_ordinal_stem(n) + "e" for n in (1, 3, 7, 8, 19, 20, 21, 30)] == [
        "erste", "dritte", "siebte", "achte", "neunzehnte", "zwanzigste", "einundzwanzigste", "dreißigste"
    ]  # fmt: skip


@pytest.mark.parametrize("n", [-1, 10**8])
def test_numbers_out_of_range_raise(n):
    with pytest.raises(ValueError, match="covers 0"):
        german_number(n)
    with pytest.raises(ValueError, match="covers 0"):
        english_number(n)


# --- independent parsers, to check the pairs of the corpus against each other ------------------------------------

_EN_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}  # fmt: skip
_EN_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i}
_DE_UNITS = {
    "ein": 1, "eins": 1, "eine": 1, "zwei": 2, "drei": 3, "vier": 4, "fünf": 5, "sechs": 6, "sieben": 7, "acht": 8,
    "neun": 9, "zehn": 10, "elf": 11, "zwölf": 12, "dreizehn": 13, "vierzehn": 14, "fünfzehn": 15, "sechzehn": 16,
    "siebzehn": 17, "achtzehn": 18, "neunzehn": 19, "null": 0,
}  # fmt: skip
_DE_TENS = {"zwanzig": 20, "dreißig": 30, "vierzig": 40, "fünfzig": 50, "sechzig": 60, "siebzig": 70, "achtzig": 80,
            "neunzig": 90}  # fmt: skip


def parse_english(text: str) -> int:
    if re.fullmatch(r"[\d,]+", text):
        return int(text.replace(",", ""))
    total, current = 0, 0
    for word in text.replace("-", " ").split():
        if word == "and":
            continue
        if word in _EN_UNITS:
            current += _EN_UNITS[word]
        elif word in _EN_TENS:
            current += _EN_TENS[word]
        elif word == "hundred":
            current *= 100
        elif word in ("thousand", "million"):
            total += current * (1000 if word == "thousand" else 10**6)
            current = 0
        else:
            raise ValueError(word)
    return total + current


def _de_below_100(word: str) -> int:
    if not word:
        return 0
    if word in _DE_UNITS:
        return _DE_UNITS[word]
    if word in _DE_TENS:
        return _DE_TENS[word]
    unit, tens = word.split("und")
    return _DE_UNITS[unit] + _DE_TENS[tens]


def _de_below_1000(word: str) -> int:
    if "hundert" in word:
        head, rest = word.split("hundert")
        return (_DE_UNITS[head] if head else 1) * 100 + _de_below_100(rest)
    return _de_below_100(word)


def parse_german(text: str) -> int:
    millions = 0
    match = re.fullmatch(r"(\S+) Million(?:en)?(?: (\S+))?", text)
    if match:
        millions, text = _de_below_1000(match.group(1)), match.group(2) or ""
    if "tausend" in text:
        head, rest = text.split("tausend")
        return millions * 10**6 + (_de_below_1000(head) if head else 1) * 1000 + _de_below_1000(rest)
    return millions * 10**6 + _de_below_1000(text)


@pytest.fixture(scope="module")
def ds():
    return default_corpus(seed=0)


@pytest.fixture(scope="module")
def pairs(ds):
    return [(r["en"], r["de"]) for split in ds.values() for r in split["translation"]]


def test_parsers_agree_with_the_table():
    for n, word in GERMAN_NUMBERS.items():
        assert parse_german(word) == n
        assert parse_english(english_number(n)) == n


def test_bare_numbers_say_the_same_number_in_both_languages(pairs):
    checked = 0
    for en, de in pairs:
        en_number, de_number = en.removeprefix("the number "), de.removeprefix("die Zahl ")
        assert (en_number == en) == (de_number == de), (en, de)
        try:
            n = parse_english(en_number)
        except ValueError:
            continue  # not a number alone
        if re.fullmatch(r"[a-zäöüß]+(?: Million(?:en)?)?(?: [a-zäöüß]+)?", de_number) is None:
            continue
        m = parse_german(de_number)
        if 1800 <= m < 2100 and en_number in (english_year(m, style=0), english_year(m, style=1)):
            continue  # a year read as a year: "nineteen seventy-one"
        assert n == m, (en, de)
        checked += 1
    assert checked > 500


def test_counted_nouns_agree_in_number_and_case(pairs):
    """ "forty-two red apples" → "zweiundvierzig rote Äpfel": same number; one → ein/eine with a matching ending;
    after "mit" the dative plural ends in -n or -s."""
    nouns = {n.en_plural: n for n in corpus.NOUNS}
    singular = {n.en: n for n in corpus.NOUNS}
    checked = {"plural": 0, "one": 0, "dative": 0}
    for en, de in pairs:
        words = en.split()
        if (
            words[-1] in nouns
            and not en[0].isupper()
            and not en.startswith(("a ", "the "))
            and words[0] not in ("one", "1")
        ):
            noun = nouns[words[-1]]
            en_count = " ".join(w for w in words[:-1] if w not in {a.en for a in corpus.ADJECTIVES})
            de_words = de.split()
            adjective = len(words) >= 2 and words[-2] in {a.en for a in corpus.ADJECTIVES}
            de_count = " ".join(de_words[: len(de_words) - 1 - adjective])
            assert parse_english(en_count) == parse_german(de_count), (en, de)
            assert de_words[-1] == noun.de_plural, (en, de)
            if adjective:
                assert de_words[-2].endswith("e") and not de_words[-2].endswith("en"), (en, de)
            checked["plural"] += 1
        elif words[0] in ("one", "1") and words[-1] in singular and len(words) <= 3:
            noun = singular[words[-1]]
            article = {"m": "ein", "f": "eine", "n": "ein"}[noun.gender]
            assert de.split()[0] == article and de.split()[-1] == noun.de, (en, de)
            if len(words) == 3:
                ending = {"m": "er", "f": "e", "n": "es"}[noun.gender]
                assert de.split()[1].endswith(ending), (en, de)
            checked["one"] += 1
        elif re.fullmatch(r"an? \w+ with .+", en) and words[-1] in nouns and not re.search(r" with (one|1) ", en):
            assert " mit " in de and de.split()[-1].endswith(("n", "s")), (en, de)
            checked["dative"] += 1
    assert min(checked.values()) > 20, checked


MONTHS = dict(corpus.MONTHS)


def check_rules(pairs, rules) -> int:
    """Each pair whose English fully matches a rule's pattern must have the German the rule makes of the match;
    returns how many pairs were checked."""
    checked = 0
    for en, de in pairs:
        for pattern, german in rules:
            match = re.fullmatch(pattern, en)
            if match:
                assert de == german(*match.groups()), (en, de)
                checked += 1
    return checked


def test_dates_put_the_day_first_with_a_period(pairs):
    rules = [
        (r"on (\w+) (\d+), (\d{4})", lambda month, day, year: f"am {day}. {MONTHS[month]} {year}"),
        (r"the (\d+)(?:st|nd|rd|th) of (\w+)", lambda day, month: f"der {day}. {MONTHS[month]}"),
    ]
    assert check_rules(pairs, rules) > 50


def test_clock_times(pairs):
    hours = {english_number(h): h for h in range(1, 13)}
    rules = [  # German counts half towards the next hour: half past seven → halb acht
        (r"at half past (\w+)", lambda hour: f"um halb {german_number(hours[hour] % 12 + 1)}"),
        (r"at (\d+):(\d\d) pm", lambda hour, minute: f"um {int(hour) % 12 + 12}:{minute} Uhr"),
        (r"at one o'clock", lambda: "um ein Uhr"),
    ]
    assert check_rules(pairs, rules) > 20


def test_sentences_put_the_verb_where_german_wants_it(pairs):
    subjects = sorted(corpus.SUBJECTS, key=lambda x: -len(x.en))
    days = dict(corpus.WEEKDAYS)
    perfect = re.compile(r"(I|We|They) bought .+\.")
    that = re.compile(r"I know that .+ bought .+\.")
    counts = {"perfect": 0, "that": 0, "fronted": 0}
    for en, de in pairs:
        if perfect.fullmatch(en):  # the participle goes to the end
            assert de.split()[1] == ("haben" if en.startswith(("We", "They")) else "habe"), (en, de)
            assert de.endswith(" gekauft."), (en, de)
            counts["perfect"] += 1
        if that.fullmatch(en):  # the finite verb goes to the end of the subordinate clause
            assert de.startswith("Ich weiß, dass ") and re.search(r" gekauft (habe|hast|hat|haben)\.$", de), (en, de)
            counts["that"] += 1
        match = re.fullmatch(r"On (\w+day), (.+)\.", en)
        if match:  # a fronted time inverts subject and verb: "Am Montag habe ich ..."
            subject = next((x for x in subjects if match.group(2).startswith(x.en + " ")), None)
            if subject is None:
                continue
            words = de.split()
            assert words[:2] == ["Am", days[match.group(1)]], (en, de)
            assert " ".join(words[3:]).startswith(subject.de + " "), (en, de)
            counts["fronted"] += 1
    assert min(counts.values()) > 0, counts


def test_umlauts_and_eszett_occur(pairs):
    targets = [de for _, de in pairs]
    for letter in "äöüÄß":
        assert sum(letter in de for de in targets) > 50, letter
    assert sum(bool(re.search("[äöüÄÖÜß]", de)) for de in targets) > len(targets) / 3


def test_splits_sizes_shape_and_disjoint_sources(ds):
    assert {k: len(v) for k, v in ds.items()} == {"train": 20000, "validation": 500, "test": 500}
    assert set(ds["train"].features["translation"].languages) == {"en", "de"}
    sources = {split: [r["en"] for r in part["translation"]] for split, part in ds.items()}
    for split, rows in sources.items():
        assert len(set(rows)) == len(rows), f"duplicate sources in {split}"
    train = set(sources["train"])
    assert not train & set(sources["validation"])
    assert not train & set(sources["test"])
    assert not set(sources["validation"]) & set(sources["test"])
    assert all(r["en"].strip() and r["de"].strip() for part in ds.values() for r in part["translation"])


def test_deterministic_in_seed_and_train_independent_of_held_out_sizes(ds):
    small = default_corpus(seed=0, train_size=300, validation_size=20, test_size=20)
    assert small["train"]["translation"] == ds["train"]["translation"][:300]
    again = default_corpus(seed=0, train_size=300, validation_size=20, test_size=20)
    assert again["test"]["translation"] == small["test"]["translation"]
    other = default_corpus(seed=1, train_size=300, validation_size=20, test_size=20)
    assert other["train"]["translation"] != small["train"]["translation"]
    more_held_out = default_corpus(seed=0, train_size=300, validation_size=50, test_size=0)
    assert more_held_out["train"]["translation"] == small["train"]["translation"]
    assert len(more_held_out["test"]) == 0


def test_every_source_has_one_translation():
    """generate_pairs raises when a repeated English source comes with another German target; draw enough pairs
    that many sources repeat."""
    seen: dict[str, str] = {}
    corpus.generate_pairs(random.Random(7), 60000, seen)
    assert len(seen) == 60000


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="train_size must be a non-negative int"):
        default_corpus(train_size=-1)
