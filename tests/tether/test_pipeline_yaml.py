"""A pipeline shown to the Tether as YAML reads back as the same pipeline, stage options too."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from quanta.pipelines.loader import pipelines_parse
from tether.selectors import pipeline_yaml


def test_it_writes_yaml_the_loader_reads_back_as_the_same_spec() -> None:
    for path in sorted((Path(settings.BASE_DIR) / "pipelines").glob("*.yaml")):
        [(_, spec)], problems = pipelines_parse(path.read_text(), source=path.name, roles=None)
        assert problems == []
        spec["stages"][-1]["verdict"] = "comment"
        spec["stages"][-1]["verify_retries"] = 5
        [(_, again)], problems = pipelines_parse(pipeline_yaml(spec), source="shown", roles=None)
        assert problems == []
        assert again == spec, path.name
        assert any(stage.get("verify") for stage in again["stages"]), path.name
