"""Synthetic bug-fix tasks (the generator's API; modules: templates, mutations, verify, generate, oracle).

    from flywheel.tasks.synth import generate_tasks, oracle_actions
    tasks = generate_tasks(50, seed=0, split="train", difficulty="easy")
"""

from flywheel.tasks.loaders import RUNNER_FILE
from flywheel.tasks.synth.generate import (
    RUNNERS,
    easy_statement,
    generate_tasks,
    minimal_edit,
    with_runner,
    write_tasks,
)
from flywheel.tasks.synth.mutations import instantiate, mutate, mutation_sites
from flywheel.tasks.synth.oracle import oracle_actions, task_summary
from flywheel.tasks.synth.templates import DIFFICULTIES, MUTATIONS, TEMPLATES, Split, Template, split_of, templates_for
from flywheel.tasks.synth.verify import run_tests_inprocess

__all__ = [
    "DIFFICULTIES", "MUTATIONS", "RUNNERS", "RUNNER_FILE", "TEMPLATES", "Split", "Template", "easy_statement",
    "generate_tasks", "instantiate", "minimal_edit", "mutate", "mutation_sites", "oracle_actions",
    "run_tests_inprocess", "split_of", "task_summary", "templates_for", "with_runner", "write_tasks",
]
