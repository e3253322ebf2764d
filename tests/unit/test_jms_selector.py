"""The JMS selector syntax check (JMS 2.0 §3.8.1.1; spec-digest §12.4), over valid and invalid selectors."""

from __future__ import annotations

import pytest

from router.jms.selector import SelectorSyntaxError, check_selector

VALID = [
    "region = 'EU'",
    "JMSType = 'car' AND color = 'blue' AND weight > 2500",
    "age BETWEEN 15 AND 19", "age NOT BETWEEN 15 AND 19",
    "Country IN ('UK','US','France')", "Country NOT IN ('UK')",
    "phone LIKE '12%3'", "word not like 'l_se'", r"underscored LIKE '\_%' ESCAPE '\'",
    "prop IS NULL", "prop is not null",
    "NOT (a = 1 OR b <> 2) AND c >= 3",
    "a + b * -c / 2 - +1 < 7E3", "x = 7.", "x = -57.9E2", "x = .5", "x = 0x1F", "x = 12L", "x = 3.0d",
    "flag", "flag = TRUE", "NOT flag", "name = 'it''s'",
    "JMSPriority > 4 or JMSDeliveryMode = 'PERSISTENT'", "$dollar = 1", "_under_score = 2",
    "(a > 1) AND (b < 2)", "(a + 1) * 2 = 4", "äöü = 'x'",
]
INVALID = [
    "region = ", "region =", "", "   ", "= 'EU'", "a = 'x", "a == 1", "a = 1 AND", "a = 1 OR OR b = 2",
    "(a = 1", "a = 1)", "a IN ()", "a IN ('x',)", "a IN (1, 2)", "a LIKE b", "a LIKE 'x' ESCAPE 'ab'",
    "a IS NOT", "a NOT NULL", "1 IN ('x')", "a + 1 LIKE 'x'", "a BETWEEN 1", "a BETWEEN 1 OR 2", "a.b = 1",
    "a-b-", "a = 1; DROP TABLE t", "a = \"x\"", "a NOT = 1", "NOT",
]


@pytest.mark.parametrize("text", VALID)
def test_valid_selectors_pass(text: str) -> None:
    assert check_selector(f"  {text} ") == text.strip()


@pytest.mark.parametrize("text", INVALID)
def test_invalid_selectors_are_refused_with_a_reason(text: str) -> None:
    with pytest.raises(SelectorSyntaxError, match=r"expected|unexpected|empty"):
        check_selector(text)
