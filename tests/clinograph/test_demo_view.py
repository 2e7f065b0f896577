"""clinograph/demo_view.py: the terminal views' console."""

from clinograph import demo_view


def test_into_a_file_the_tables_get_160_columns_unless_columns_says(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert demo_view._width() == 160  # rich's default 80 wrapped the nine-column table into "featu…" cells
    monkeypatch.setenv("COLUMNS", "100")
    assert demo_view._width() is None  # rich reads COLUMNS itself
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert demo_view._width() is None  # a terminal: its own width
