from __future__ import annotations

from django.apps import AppConfig


class PsychonautsConfig(AppConfig):
    name = "psychonauts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bursts.hooks import ON_RUNS_DRAINED, WAVE_CHECKS
        from core.warmups import worker_warmup_register
        from psychonauts.hooks import on_runs_drained
        from psychonauts.preflight import wave_problems
        from psychonauts.selectors import role_names
        from quanta.fields import verify_command_check_source
        from quanta.pipelines.services import role_names_source

        role_names_source(role_names)
        verify_command_check_source(_verify_command_problem)
        worker_warmup_register(_agents_warm_up)
        if on_runs_drained not in ON_RUNS_DRAINED:
            ON_RUNS_DRAINED.append(on_runs_drained)
        if wave_problems not in WAVE_CHECKS:
            WAVE_CHECKS.append(wave_problems)
        _spend_section_register()


def _spend_section_register() -> None:
    """The wave page's spend: by role, its cache share, and its projected cost."""
    from bursts.sections import WaveSection, wave_section_register
    from psychonauts.selectors import wave_spend_context

    wave_section_register(WaveSection("psychonauts/_wave_spend.html", wave_spend_context))


def _agents_warm_up(concurrency: int) -> None:
    from psychonauts.warmup import agents_warm_up

    agents_warm_up(concurrency)


def _verify_command_problem(command: str) -> str:
    """psychonauts.verify's judgement, loaded when a verify command is first judged (with the
    sandbox and the environments beneath it), not when the apps load."""
    from psychonauts.verify import verify_command_problem

    return verify_command_problem(command)
