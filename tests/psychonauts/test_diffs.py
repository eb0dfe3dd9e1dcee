"""Reading unified diffs per file: what the Focus page and the change page show."""

from __future__ import annotations

from psychonauts.workspaces.diffs import diff_by_path, diff_line, diff_parse

DIFF = """\
diff --git a/hello.py b/hello.py
new file mode 100644
index 0000000..2f9a8a1
--- /dev/null
+++ b/hello.py
@@ -0,0 +1,2 @@
+print('hi')
+print('there')
diff --git a/README.md b/README.md
deleted file mode 100644
index 5c4b3a1..0000000
--- a/README.md
+++ /dev/null
@@ -1 +0,0 @@
-# demo
"""


def test_it_splits_a_diff_per_file_in_its_order():
    hello, readme = diff_parse(DIFF)
    assert (hello.path, hello.additions, hello.deletions) == ("hello.py", 2, 0)
    assert (readme.path, readme.additions, readme.deletions) == ("README.md", 0, 1)


def test_it_tags_each_shown_line_and_leaves_out_the_index_and_path_lines():
    hello = diff_parse(DIFF)[0]
    assert hello.lines == [
        {"tag": "ctx", "text": "new file mode 100644"},
        {"tag": "hunk", "text": "@@ -0,0 +1,2 @@"},
        {"tag": "add", "text": "+print('hi')"},
        {"tag": "add", "text": "+print('there')"},
    ]


def test_it_keeps_each_files_text_as_it_was():
    readme = diff_by_path(DIFF)["README.md"]
    assert readme.text == DIFF[DIFF.index("diff --git a/README.md") :].rstrip("\n")
    assert readme.text.startswith("diff --git a/README.md b/README.md\ndeleted file mode")


def test_it_ignores_what_comes_before_the_first_file():
    assert diff_parse("warning: something\n" + DIFF)[0].lines == diff_parse(DIFF)[0].lines
    assert diff_parse("") == []
    assert diff_parse("no diff here\n") == []


def test_a_cut_diff_ends_with_its_note_in_the_last_file():
    cut = DIFF + "\n… [1200 characters cut]\n"
    assert diff_parse(cut)[-1].lines[-1] == {"tag": "ctx", "text": "… [1200 characters cut]"}


def test_it_tags_a_single_line():
    assert diff_line("-x") == {"tag": "del", "text": "-x"}
    assert diff_line(" x") == {"tag": "ctx", "text": " x"}
    assert diff_line("") == {"tag": "ctx", "text": ""}


def test_it_counts_removed_and_added_lines_that_look_like_path_lines():
    sql = (
        "diff --git a/schema.sql b/schema.sql\n"
        "index 1111111..2222222 100644\n"
        "--- a/schema.sql\n"
        "+++ b/schema.sql\n"
        "@@ -1,2 +1,2 @@\n"
        "--- the users table\n"
        "+++ counter\n"
        " CREATE TABLE users (id int);\n"
    )
    patch = diff_parse(sql)[0]
    assert (patch.additions, patch.deletions) == (1, 1)
    assert [line["text"] for line in patch.lines[1:3]] == ["--- the users table", "+++ counter"]
