"""Whose turns a question asks about when it names nobody."""

import pytest

from sidecar.domain import Role
from sidecar.memory.question_person import asked_about


@pytest.mark.parametrize(("question", "role"), [
    ("What degree did I graduate with?", Role.USER),
    ("Where did I buy my new tennis racket from?", Role.USER),
    ("How long have I been using my Fitbit?", Role.USER),
    ("我住在哪里？", Role.USER),
    ("Can you remind me what was the 7th job in the list you provided?", Role.ASSISTANT),
    ("You mentioned a remedy for dark circles; what was it?", Role.ASSISTANT),
    ("What was the remedy you’ve suggested for dark circles?", Role.ASSISTANT),  # a phone's apostrophe
    ("What was the second of your suggestions for the trip?", Role.ASSISTANT),
    ("你推荐的那本书叫什么？", Role.ASSISTANT),
    ("Can you recommend some resources for video editing?", None),  # a request now, not a past turn
    ("What did Caroline paint last summer?", None),
    ("When did Melanie run the charity race?", None),
])
def test_whose_turns_a_question_asks_about(question, role):
    assert asked_about(question) == role


@pytest.mark.parametrize(("question", "role"), [
    ("How many eggs did you say we need for the omelette?", Role.ASSISTANT),
    ("I'm going back to our previous conversation about the book. Can you remind me what color the boat was?", None),
    ("I'm planning a trip; remind me of the dessert shop we talked about last time?", None),
    ("Can you remind me what the average improvement in framerate was?", None),  # "me": the request's object
    ("我们聊过的那家餐厅叫什么？", None),
])
def test_requests_and_the_conversation_itself_name_no_side(question, role):
    assert asked_about(question) == role
