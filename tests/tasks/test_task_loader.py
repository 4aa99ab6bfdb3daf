from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rollyard.core.errors import TaskError
from rollyard.tasks import TaskFiles, TaskSpec, load_task, load_tasks, task_dirs, write_task


def _files(**spec: object) -> TaskFiles:
    base = {"id": "t1", "family": "demo", "instruction": "do it", "test_command": "true"}
    return TaskFiles(
        spec=TaskSpec.model_validate({**base, **spec}),
        workspace={"a.txt": "x"},
        tests={"check.sh": "exit 0"},
        solution={"a.txt": "y"},
    )


def _rewrite_yaml(root: Path, **changes: object) -> None:
    data = yaml.safe_load((root / "task.yaml").read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k)
        else:
            data[k] = v
    (root / "task.yaml").write_text(yaml.safe_dump(data))


def test_a_written_task_loads_back_with_the_same_spec(tmp_path: Path) -> None:
    files = _files(metadata={"k": 1}, hygiene_artefacts=["build/**", "*.log"])
    root = write_task(tmp_path / "t1", files)
    task = load_task(root)
    assert task.spec == files.spec
    assert (task.workspace_dir / "a.txt").read_text() == "x"  # type: ignore[operator]
    assert (task.tests_dir / "check.sh").is_file()


@pytest.mark.parametrize("field", ["id", "instruction", "test_command", "family"])
def test_a_missing_field_is_named_in_the_error(tmp_path: Path, field: str) -> None:
    root = write_task(tmp_path / "t", _files())
    _rewrite_yaml(root, **{field: None})
    with pytest.raises(TaskError, match=f"missing field '{field}'"):
        load_task(root)


def test_an_unknown_field_is_rejected(tmp_path: Path) -> None:
    root = write_task(tmp_path / "t", _files())
    _rewrite_yaml(root, tset_command="typo")
    with pytest.raises(TaskError, match="unknown field 'tset_command'"):
        load_task(root)


@pytest.mark.parametrize(
    ("text", "match"), [("id: [unclosed", "not valid YAML"), ("- a\n- b\n", "expected a mapping")]
)
def test_a_malformed_task_yaml_gets_a_clear_error(tmp_path: Path, text: str, match: str) -> None:
    root = write_task(tmp_path / "t", _files())
    (root / "task.yaml").write_text(text)
    with pytest.raises(TaskError, match=match):
        load_task(root)


def test_a_task_without_hidden_tests_is_rejected(tmp_path: Path) -> None:
    root = write_task(tmp_path / "t", _files())
    (root / "tests" / "check.sh").unlink()
    with pytest.raises(TaskError, match="hidden tests/"):
        load_task(root)


def test_a_task_without_a_solution_is_rejected(tmp_path: Path) -> None:
    root = write_task(tmp_path / "t", _files())
    (root / "solution" / "a.txt").unlink()
    (root / "solution").rmdir()
    with pytest.raises(TaskError, match="solution/"):
        load_task(root)


def test_a_script_solution_needs_its_script(tmp_path: Path) -> None:
    root = write_task(tmp_path / "t", _files(solution="script"))
    with pytest.raises(TaskError, match=r"solve\.sh"):
        load_task(root)


def test_a_task_needs_a_workspace_or_a_setup_script(tmp_path: Path) -> None:
    files = _files().model_copy(update={"workspace": {}})
    root = write_task(tmp_path / "t", files)
    with pytest.raises(TaskError, match="workspace/ directory or a setup script"):
        load_task(root)
    _rewrite_yaml(root, setup="setup.sh")
    with pytest.raises(TaskError, match=r"setup script 'setup\.sh' does not exist"):
        load_task(root)
    (root / "setup.sh").write_text("mkdir -p src\n")
    assert load_task(root).setup_script == root.resolve() / "setup.sh"


@pytest.mark.parametrize("glob", ["../x", "/etc/passwd", "a b", "$(rm -rf ~)", "x;y"])
def test_hygiene_artefacts_must_be_plain_relative_globs(glob: str) -> None:
    with pytest.raises(ValueError, match="hygiene artefact"):
        TaskSpec(id="t", family="f", instruction="i", test_command="true", hygiene_artefacts=[glob])


def test_a_missing_directory_is_a_task_error(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such task directory"):
        load_task(tmp_path / "nope")
    with pytest.raises(TaskError, match=r"no task\.yaml"):
        load_task(tmp_path)


def test_a_list_file_names_task_dirs_relative_to_itself(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_task(tmp_path / name, _files(id=name))
    (tmp_path / "list.txt").write_text("# kept\nb\n\n")
    assert task_dirs(tmp_path / "list.txt") == [tmp_path / "b"]
    assert [t.id for t in load_tasks(tmp_path)] == ["a", "b"]


def test_duplicate_task_ids_are_rejected(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_task(tmp_path / name, _files(id="same"))
    with pytest.raises(TaskError, match="duplicate task id 'same'"):
        load_tasks(tmp_path)
