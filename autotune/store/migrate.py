"""Old databases gain the columns newer autotune writes, when they are opened.

Every column added after the first release is nullable, so adding it is all a migration needs: a
study written before the scheduler existed still opens, resumes and shows (its trials simply carry no
host, lease or overlap). Two processes opening one database at once may race to add a column; the
loser's "duplicate column" error is ignored after checking that the column is there.
"""

from __future__ import annotations

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from autotune.store.models import Base


def missing_columns(engine: Engine) -> dict[str, list[str]]:
    """Table -> columns the models have and the database lacks (tables that do not exist are left
    to create_all)."""
    insp = inspect(engine)
    out: dict[str, list[str]] = {}
    for table in Base.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        lacking = [c.name for c in table.columns if c.name not in have]
        if lacking:
            out[table.name] = lacking
    return out


def migrate(engine: Engine) -> list[str]:
    """Add the missing nullable columns; returns them as `table.column`."""
    added: list[str] = []
    for name, columns in missing_columns(engine).items():
        table = Base.metadata.tables[name]
        for col_name in columns:
            col = table.columns[col_name]
            if not col.nullable:
                raise RuntimeError(f"{name}.{col_name} is not nullable: it needs a real migration")
            ddl = f'ALTER TABLE {name} ADD COLUMN {col_name} {col.type.compile(dialect=engine.dialect)}'
            try:
                with engine.begin() as conn:
                    conn.execute(text(ddl))
                added.append(f"{name}.{col_name}")
            except Exception:
                if col_name in (missing_columns(engine).get(name) or []):
                    raise       # not a lost race: the column is still missing
    return added
