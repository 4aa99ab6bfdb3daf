"""The language-mixing heuristic."""

from __future__ import annotations

import pytest

from rollyard.rl.language import is_language_mixed, script_counts


def test_single_language_text_is_not_mixed() -> None:
    assert not is_language_mixed("The test fails because the import path is wrong.")
    assert not is_language_mixed("测试失败是因为导入路径错误。")
    assert not is_language_mixed("テストは失敗しました。理由は簡単です。")  # kana + kanji are one script


def test_two_scripts_beyond_the_share_are_mixed() -> None:
    assert is_language_mixed("我们先看 the failing test 然后修改")
    assert not is_language_mixed("我们先看测试然后修改它的逻辑并运行 x", min_share=0.1)


def test_code_spans_do_not_count_as_another_language() -> None:
    text = "运行这个命令来修复问题：`pip install requests` 然后\n```python\nimport requests\n```"
    assert script_counts(text)["LATIN"] == 0
    assert not is_language_mixed(text)


def test_expected_scripts_flag_any_other_script() -> None:
    assert is_language_mixed("Привет, как дела", expected={"latin"})
    assert not is_language_mixed("hello there", expected={"latin"})


def test_short_texts_and_bad_shares() -> None:
    assert not is_language_mixed("ok 好")
    with pytest.raises(ValueError):
        is_language_mixed("text", min_share=0.0)
