import pytest

from ddpdoctor.catalogue import CATALOGUE, REQUIRED_FIELDS, CatalogueError, load_files
from ddpdoctor.check.registry import all_rules

SLUGS = {
    "backend-device-mismatch", "init-module-scope", "foreign-device-hooks", "collective-divergence",
    "partial-epoch-metric", "collective-timeout", "dead-rank", "sampler-epoch", "unused-parameters",
    "process-group-missing", "checkpoint-race",
    "sharded-step-divergence", "replica-divergence", "single-rank-long-section",
}

VALID = b'''
id = "F1"
slug = "backend-device-mismatch"
title = "t"
summary = "s"
symptoms = ["No backend type associated with device type cpu"]
why = "w"
fixes = ["f"]
references = ["https://pytorch.org/docs/stable/distributed.html"]
rules = ["DDP301"]
'''


def test_packaged_catalogue_has_every_class_of_the_spec():
    assert {c.slug for c in CATALOGUE} == SLUGS


def test_every_class_is_documented():
    for cls in CATALOGUE:
        assert cls.symptoms and cls.fixes and cls.references, cls.slug
        assert cls.broken and cls.fixed, f"{cls.slug}: example missing"
        assert all(ref.startswith("https://") for ref in cls.references), cls.slug


def test_rule_registry_and_catalogue_agree():
    rules = all_rules()
    CATALOGUE.check_rule_codes({code: rule.class_slug for code, rule in rules.items()})
    # both sides derived, no hand-kept list: every class's rules are registered and every rule is a class's
    assert set(rules) == {code for cls in CATALOGUE for code in cls.rules}
    assert rules


@pytest.mark.parametrize("field", REQUIRED_FIELDS)
def test_missing_field_is_rejected(field):
    lines = [line for line in VALID.decode().splitlines() if not line.startswith(f"{field} =")]
    with pytest.raises(CatalogueError, match=field):
        load_files([("broken.toml", "\n".join(lines).encode())])


def test_duplicate_slug_is_rejected():
    other = VALID.replace(b'id = "F1"', b'id = "F2"').replace(b"DDP301", b"DDP302")
    with pytest.raises(CatalogueError, match="duplicate slug"):
        load_files([("a.toml", VALID), ("b.toml", other)])


def test_rule_pointing_to_unknown_class_is_rejected():
    catalogue = load_files([("a.toml", VALID)])
    with pytest.raises(CatalogueError, match="unknown failure class"):
        catalogue.check_rule_codes({"DDP301": "backend-device-mismatch", "DDP999": "no-such-class"})


def test_rule_listed_by_a_class_but_not_defined_is_rejected():
    catalogue = load_files([("a.toml", VALID)])
    with pytest.raises(CatalogueError, match="does not define"):
        catalogue.check_rule_codes({})


def test_invalid_toml_names_the_file():
    with pytest.raises(CatalogueError, match="bad.toml"):
        load_files([("bad.toml", b"id = ")])


@pytest.mark.parametrize("key,expected", [
    ("F4", ["collective-divergence"]),
    ("f4", ["collective-divergence"]),
    ("collective-divergence", ["collective-divergence"]),
    ("DDP101", ["collective-divergence"]),
    ("ddp202", ["init-module-scope"]),
    ("F6", ["collective-timeout", "dead-rank"]),
    ("F99", []),
    ("nonsense", []),
])
def test_lookup(key, expected):
    assert [c.slug for c in CATALOGUE.lookup(key)] == expected
