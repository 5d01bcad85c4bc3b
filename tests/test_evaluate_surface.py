"""The surface a translator copies verbatim, stripped from retrieval pairs (issue 63, item 3):
hand-written catalog messages against their hand-stripped forms."""

from __future__ import annotations

import pytest

from xylent.tasks.evaluate.surface import shares_surface, strip_surface, stripped_pairs, surface_overlap


@pytest.mark.parametrize("text, stripped", [
    ("%(num)d Stunde", "Stunde"),
    ("(Verstecktes Feld %(name)s) %(error)s", "Verstecktes Feld"),
    ("%s PB", "PB"),
    ("Leere Liste und „%(class_name)s.allow_empty“ ist False.", "Leere Liste und ist False"),
    ("Die Anzahl der Tage muss zwischen {min_days} und {max_days} sein.", "Die Anzahl der Tage muss zwischen und sein"),
    ('<a href="https://docs.djangoproject.com/en/%(version)s/releases/" target="_blank">Versionshinweise</a> '
     "für Django %(version)s anzeigen", "Versionshinweise für Django anzeigen"),
    ("Wert „%(value)s“ hat das korrekte Format (HH:MM[:ss[.uuuuuu]]), aber ist eine ungültige Zeitangabe.",
     "Wert hat das korrekte Format HH MM ss uuuuuu aber ist eine ungültige Zeitangabe"),
    ("Mail admin@example.com or see www.example.org &amp; http://x.y/z?a=1 now", "Mail or see now"),
    ("Seite ١٢ von 3,5 — ${total} £", "Seite von"),
    ("100% sicher: {0} von {}", "sicher von"),
    ("請確認 %(max)s 位數以內。", "請確認 位數以內"),
    ("Ваш пароль изменён.", "Ваш пароль изменён"),
])
def test_strip_surface_keeps_the_words_of_any_script(text, stripped):
    assert strip_surface(text) == stripped


def test_the_overlap_share_counts_pairs_that_share_a_copied_string():
    src = ["%(num)d Stunde", "Hallo Welt", "Version 2.1 von {app}", "Siehe https://a.b/c"]
    tgt = ["%(num)d hour", "Hello world", "Version 3 of {name}", "See https://a.b/c"]
    assert [shares_surface(a, b) for a, b in zip(src, tgt)] == [True, False, False, True]
    assert surface_overlap(src, tgt) == 50.0
    assert surface_overlap([], []) == 0.0


def test_stripped_pairs_drop_empty_identical_and_repeated_ones():
    src = ["%(num)d Stunde", "%s PB", "%(count)s", "Ausgewählte %(model)s löschen",
           "Ausgewählte %(verbose_name_plural)s löschen", "Esperanto", "Datei"]
    tgt = ["%(num)d hour", "%s PB", "%(count)s items", "Delete selected %(model)s",
           "Delete selected %(verbose_name_plural)s", "esperanto", "File"]
    got_src, got_tgt, dropped = stripped_pairs(src, tgt)
    assert got_src == ["Stunde", "Ausgewählte löschen", "Datei"]
    assert got_tgt == ["hour", "Delete selected", "File"]
    assert dropped == 4  # PB = PB, an empty side, the repeated message, Esperanto = esperanto


def test_the_verdict_reads_the_stripped_variant_where_a_task_has_one():
    from xylent.tasks.evaluate.scorecard import headline_tags, mlflow_metrics, render

    def ret(avg, stripped):
        return {"kind": "tatoeba", "languages": {"de": {"accuracy": avg, "n": 200}}, "avg": avg,
                "by_layer": {"0": avg}, "surface_overlap": 18.0, "surface_overlap_by_language": {"de": 18.0},
                "stripped": {"languages": {"de": {"accuracy": stripped, "n": 180, "dropped": 20}}, "avg": stripped,
                             "by_layer": {"0": stripped}}}

    scores = {"tasks": {"ret": {"kind": "tatoeba"}},
              "models": {"pipeline": {"ret": ret(25.0, 3.5)}, "random-init": {"ret": ret(20.0, 14.6)},
                         "bag-of-subwords": {"ret": ret(23.0, 24.6)}}}
    card = render(scores)
    head = card.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "**pipeline**: at or below a trivial peer on 1 of 1 tasks: ret stripped 3.5 (≤ random-init 14.6, " \
           "bag-of-subwords 24.6)." in head, head
    assert "Surface overlap: 18.0 % of the pairs" in card
    assert "| de | 180 / 20 | 3.5 | 14.6 | 24.6 |" in card
    tags = headline_tags(scores)
    assert tags["eval.ret"] == "25.0 (random-init 20.0, bag-of-subwords 23.0)"
    assert tags["eval.ret.stripped"] == "3.5, random-init 14.6, bag-of-subwords 24.6"
    metrics = mlflow_metrics(scores["models"]["pipeline"])
    assert metrics["eval/ret/stripped/avg"] == 3.5 and metrics["eval/ret/surface_overlap"] == 18.0
    assert metrics["eval/ret/stripped/de/accuracy"] == 3.5
    scores["models"]["pipeline"]["ret"] = ret(10.0, 30.0)  # below the peers as given, above them stripped
    assert "**pipeline**: above every trivial peer on all 1 tasks." in render(scores)
