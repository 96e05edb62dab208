"""A task that needs a live database: write a schema migration and apply it to the PostgreSQL the task runs.

    from flywheel.tasks.migration import migration_task, reference_actions
    task = migration_task()                      # services = [{"kind": "postgres", ...}]
    calls = reference_actions(task)              # write the migration, `python migrate.py`, submit
    save_tasks([task], "migration.jsonl")        # the same task as a task file (tasks/loaders.py)

Why: an environment that mimics a user's machine includes its services. The workspace is a small app whose
schema is managed by `migrate.py` (plain SQL files applied in order, recorded in `schema_migrations`, through
`psql`); the database starts at migration 001 (the service's `init_sql`). The fix is two steps, as on a real
machine: write `migrations/002_add_email.sql` *and run it*. The hidden tests query the live database (the
column, its constraints, the backfill, the recorded version) and call the app, so a migration written but
never applied earns 0, and so does the untouched tree. Tests run under the shipped `runtests.py`
(`tasks/minitest.py`), so grading needs no database driver: `psql` of the Debian packages is the client.
"""

from __future__ import annotations

from flywheel.tasks.loaders import RUNNER_FILE, runner_source
from flywheel.types import Task, ToolCall

MIGRATE = '''"""Apply migrations/NNN_*.sql in order, each once, recorded in schema_migrations.

    python migrate.py            # the database is the one of $DATABASE_URL / the PG* variables
"""
import pathlib
import subprocess
import sys


def psql(sql):
    r = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-X", "-q", "-At", "-c", sql],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"migrate: {r.stderr.strip()}")
    return r.stdout


def main():
    psql("CREATE TABLE IF NOT EXISTS schema_migrations (version text PRIMARY KEY)")
    done = set(psql("SELECT version FROM schema_migrations").split())
    for path in sorted(pathlib.Path(__file__).parent.joinpath("migrations").glob("*.sql")):
        version = path.name.split("_", 1)[0]
        if version in done:
            continue
        r = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-X", "-q", "--single-transaction", "-f", str(path),
                            "-c", f"INSERT INTO schema_migrations VALUES ('{version}')"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"migrate: {path.name} failed: {r.stderr.strip()}")
        print(f"applied {path.name}")


if __name__ == "__main__":
    main()
'''

USERS = '''"""Queries of the users table (through psql, the database of $DATABASE_URL / the PG* variables)."""
import subprocess


def _query(sql, **params):
    args = ["psql", "-v", "ON_ERROR_STOP=1", "-X", "-q", "-At"]
    for k, v in params.items():
        args += ["-v", f"{k}={v}"]
    r = subprocess.run(args, input=sql, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    return [line for line in r.stdout.splitlines() if line]


def list_names():
    return _query("SELECT name FROM users ORDER BY id;")


def find_by_email(email):
    """The name of the user with this email, or None."""
    rows = _query("SELECT name FROM users WHERE email = :'email';", email=email)
    return rows[0] if rows else None
'''

MIGRATION_001 = '''CREATE TABLE users (
    id serial PRIMARY KEY,
    name text NOT NULL
);
INSERT INTO users (name) VALUES ('Alice'), ('Bob'), ('Carol Ann');
'''

MIGRATION_002 = '''ALTER TABLE users ADD COLUMN email text;
UPDATE users SET email = lower(replace(name, ' ', '.')) || '@example.com';
ALTER TABLE users ALTER COLUMN email SET NOT NULL;
ALTER TABLE users ADD CONSTRAINT users_email_key UNIQUE (email);
'''

VISIBLE_TEST = '''from app.users import find_by_email, list_names


def test_list_names():
    assert list_names() == ["Alice", "Bob", "Carol Ann"]


def test_find_by_email():
    assert find_by_email("alice@example.com") == "Alice"
'''

HIDDEN_TEST = '''import subprocess

from app.users import find_by_email, list_names


def psql(sql):
    return subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-X", "-q", "-At", "-c", sql],
                          capture_output=True, text=True)


def rows(sql):
    r = psql(sql)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_list_names():
    assert list_names() == ["Alice", "Bob", "Carol Ann"]


def test_migration_recorded():
    assert rows("SELECT version FROM schema_migrations ORDER BY version") == ["001", "002"]


def test_email_backfilled():
    assert rows("SELECT name || '|' || email FROM users ORDER BY id") == [
        "Alice|alice@example.com", "Bob|bob@example.com", "Carol Ann|carol.ann@example.com"]


def test_email_required():
    assert psql("BEGIN; INSERT INTO users (name) VALUES ('Dan'); ROLLBACK;").returncode != 0


def test_email_unique():
    r = psql("BEGIN; INSERT INTO users (name, email) VALUES ('Eve', 'bob@example.com'); ROLLBACK;")
    assert r.returncode != 0 and "unique" in r.stderr


def test_find_by_email():
    assert find_by_email("bob@example.com") == "Bob"
    assert find_by_email("carol.ann@example.com") == "Carol Ann"
    assert find_by_email("nobody@example.com") is None
'''

PROBLEM = (
    "Users need an email address. The app's schema lives in `migrations/` and is applied to the development "
    "database (PostgreSQL, at $DATABASE_URL) by `python migrate.py`; migration 001 is applied already. Add the "
    "migration `migrations/002_add_email.sql`: a column `email` on `users`, required (NOT NULL) and unique, "
    "filled for the existing users with their name lower-cased, spaces replaced by dots, followed by "
    "`@example.com` (`Carol Ann` -> `carol.ann@example.com`). Apply it to the database. "
    "`app.users.find_by_email` must then find users.")

HIDDEN_FILE = "tests/test_users_hidden.py"
SOLUTION_COMMAND = "python migrate.py"


def migration_task(task_id: str = "services-migration-add-email") -> Task:
    """The migration task (see the module docstring); `solution` holds the migration file, and
    `meta["solution_commands"]` what must run after it is written."""
    runner = runner_source()
    hidden = [f"{HIDDEN_FILE}::test_{n}" for n in ("migration_recorded", "email_backfilled", "email_required",
                                                   "email_unique", "find_by_email")]
    return Task(
        id=task_id, problem=PROBLEM,
        files={"migrate.py": MIGRATE, "app/__init__.py": "", "app/users.py": USERS,
               "migrations/001_create_users.sql": MIGRATION_001, "tests/test_users.py": VISIBLE_TEST,
               RUNNER_FILE: runner},
        visible_tests=["tests/test_users.py::test_list_names", "tests/test_users.py::test_find_by_email"],
        hidden_files={HIDDEN_FILE: HIDDEN_TEST, RUNNER_FILE: runner},
        fail_to_pass=hidden, pass_to_pass=[f"{HIDDEN_FILE}::test_list_names"],
        test_command=f"python {RUNNER_FILE} -q",
        solution={"migrations/002_add_email.sql": MIGRATION_002},
        meta={"split": "train", "difficulty": "services", "kind": "migration",
              "solution_commands": [SOLUTION_COMMAND]},
        services=[{"kind": "postgres", "database": "app", "user": "app",
                   "init_sql": MIGRATION_001 + "CREATE TABLE schema_migrations (version text PRIMARY KEY);\n"
                   "INSERT INTO schema_migrations VALUES ('001');\n"}])


def reference_actions(task: Task) -> list[ToolCall]:
    """The reference fix as tool calls: write the solution files, run the commands, submit."""
    calls = [ToolCall("write", {"path": p, "content": text}) for p, text in (task.solution or {}).items()]
    calls += [ToolCall("bash", {"command": c}) for c in task.meta.get("solution_commands", [])]
    return calls + [ToolCall("submit", {})]
