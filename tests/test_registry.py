import pytest

from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS, OBJECTIVES, Registry, RegistryError


def test_duplicate_name_is_an_error():
    reg = Registry("widget")
    reg.add("a", object())
    with pytest.raises(RegistryError, match="duplicate widget 'a'"):
        reg.add("a", object())


def test_unknown_name_suggests_closest():
    with pytest.raises(RegistryError) as e:
        METHODS.get("basline")
    assert "did you mean 'baseline'" in str(e.value)
    assert "known:" in str(e.value)


def test_decorator_registers_with_summary():
    reg = Registry("widget")

    @reg.register("thing", "does a thing")
    class Thing:
        pass

    assert reg.get("thing") is Thing
    assert next(reg.entries()).summary == "does a thing"


@pytest.mark.parametrize("registry", [METHODS, BACKBONES, DETECTORS, OBJECTIVES, DATASETS])
def test_every_entry_has_a_summary(registry):
    assert registry.names()
    for entry in registry.entries():
        assert entry.summary, f"{registry.kind} {entry.name} has no summary for `prvr-bench list`"


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_names_registered_parts(name):
    spec = METHODS.get(name)
    assert spec.backbone in BACKBONES
    assert spec.relations in DETECTORS


@pytest.mark.parametrize("name", ["a+b", "a@b", "a~b"])
def test_registered_names_never_hold_a_run_name_separator(name):
    with pytest.raises(RegistryError, match=r"separates the parts of a run name"):
        Registry("thing").add(name, object())


def test_edit_distance_counts_a_swap_of_neighbours_as_one_edit():
    from prvr.harness.base.registry import edit_distance, unknown_message

    assert [edit_distance(*p) for p in [("mls", "msl"), ("mls", "xml"), ("kitten", "sitting"), ("", "abc"),
                                        ("abc", "abc")]] == [1, 2, 3, 3, 0]
    known = ["msl", "xml", "xml-sl"]
    assert "did you mean 'msl', 'xml', 'xml-sl'?" in unknown_message("method", "mls", known)


@pytest.mark.parametrize("name, answer", [
    ("ral@holmes", "'ral@holmes' names a run, not a method: give --method ral --backbone holmes;"),
    ("baseline+sbert", "give --method baseline --set relations.name=sbert;"),
    ("msl+oracle~ignore", "give --method msl --set relations.name=oracle, with the settings its tag 'ignore'"),
])
def test_a_run_name_given_for_a_method_says_which_options_make_that_run(name, answer):
    with pytest.raises(RegistryError) as err:
        METHODS.get(name)
    assert answer in str(err.value) and "\n" not in str(err.value)


def test_a_run_name_of_no_registered_method_is_an_unknown_method():
    with pytest.raises(RegistryError, match="unknown method 'mls@holmes': did you mean"):
        METHODS.get("mls@holmes")
    with pytest.raises(RegistryError) as err:  # not printable: shown escaped, on one line
        METHODS.get("ral@holmes\nx")
    assert str(err.value).startswith("unknown method 'ral@holmes\\nx'") and "\n" not in str(err.value)
