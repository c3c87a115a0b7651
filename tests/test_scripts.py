"""Words of every script are lexical terms: a user or a manual in Russian, Greek, Arabic, Hindi,
Korean, Thai or German is matched word for word by episodic recall, long-term memory and the
knowledge base, as English and Chinese are (fastpath.reference.scripts)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.domain import Message, Role
from sidecar.text import terms

# Per language: turns (the asked one third, so no tie can put it first), and a question sharing a
# word with it and none with the others.
LANGUAGES = {
    "ru": (["Вчера мы обсуждали новый проект на работе.", "Погода в городе была очень холодной.",
            "Моя сестра живёт в Новосибирске и работает врачом.", "Вечером я смотрел фильм с друзьями.",
            "Завтра у меня встреча с начальником."], "Где живёт сестра?"),
    "el": (["Χθες συζητήσαμε το νέο έργο στη δουλειά.", "Ο καιρός στην πόλη ήταν πολύ κρύος.",
            "Η αδελφή μου ζει στην Αθήνα και δουλεύει γιατρός.", "Το βράδυ είδα μια ταινία με φίλους.",
            "Αύριο έχω συνάντηση με τον προϊστάμενο."], "Πού ζει η αδελφή;"),
    "ar": (["ناقشنا أمس المشروع الجديد في العمل.", "كان الطقس في المدينة باردا جدا.",
            "أختي تعيش في القاهرة وتعمل طبيبة.", "شاهدت فيلما مع أصدقائي في المساء.",
            "غدا لدي اجتماع مع المدير."], "أين تعيش أختي؟"),
    "hi": (["कल हमने काम पर नई परियोजना पर चर्चा की।", "शहर में मौसम बहुत ठंडा था।",
            "मेरी बहन दिल्ली में रहती है और डॉक्टर है।", "शाम को मैंने दोस्तों के साथ फिल्म देखी।",
            "कल मेरी प्रबंधक के साथ बैठक है।"], "बहन कहाँ रहती है?"),
    "ko": (["어제 회사에서 새 프로젝트를 논의했어요.", "도시의 날씨가 정말 추웠어요.",
            "제 여동생은 부산에 살고 의사로 일해요.", "저녁에 친구들과 영화를 봤어요.",
            "내일 팀장님과 회의가 있어요."], "여동생은 어디에 살아요?"),
    "th": (["เมื่อวานเราคุยเรื่องโครงการใหม่ที่ทำงาน", "อากาศในเมืองหนาวมาก",
            "น้องสาวของฉันอาศัยอยู่ที่เชียงใหม่และเป็นหมอ", "ตอนเย็นฉันดูหนังกับเพื่อน",
            "พรุ่งนี้ฉันมีประชุมกับหัวหน้า"], "น้องสาวอาศัยอยู่ที่ไหน"),
    "de": (["Gestern haben wir über das neue Projekt gesprochen.", "Das Wetter in der Stadt war sehr kalt.",
            "Meine Schwester wohnt in München und arbeitet als Ärztin.", "Abends habe ich einen Film gesehen.",
            "Morgen habe ich ein Treffen mit dem Chef."], "Wer arbeitet in München?"),
}
ASKED = 2


def test_memory_and_knowledge_terms_are_words_of_every_script():
    assert terms("Моя сестра живёт в Новосибирске") == ["моя", "сестра", "живёт", "в", "новосибирске"]
    assert terms("أختي تعيش في القاهرة") == ["أختي", "تعيش", "في", "القاهرة"]
    assert terms("मेरी बहन दिल्ली में") == ["मेरी", "बहन", "दिल्ली", "में"]  # the vowel signs stay in their word
    assert terms("부산에 살고") == ["부", "산", "에", "살", "고"]
    assert terms("เชียงใหม่") == ["เช", "ชี", "ีย", "ยง", "งใ", "ให", "หม", "ม่"]
    assert terms("Ärztin in München, payment-api v1.2") == ["ärztin", "münchen", "payment-api", "v1.2"]
    assert terms("中文 😀 ok_go") == ["中", "文", "ok_go"]


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(min_codepoint=1, max_codepoint=127), max_size=80))
def test_an_ascii_text_has_the_terms_the_rule_for_every_script_gives(text):
    """terms() reads an ASCII text with a small pattern of its own: the same terms the full rule finds
    (a non-ASCII word after it sends the whole text through the full rule)."""
    assert terms(text + " ü") == terms(text) + ["ü"]


@pytest.mark.parametrize("lang", sorted(LANGUAGES))
def test_episodic_recall_matches_the_words_of_every_script(lang):
    """With no dense share at all, only the words can rank the asked turn first."""
    from sidecar.index.word_vectors import StaticEmbedder
    from sidecar.memory.episodic import DEFAULT_RANKING
    from sidecar.memory.episodic.index import _UserIndex

    turns, question = LANGUAGES[lang]
    embedder = StaticEmbedder()
    state = _UserIndex(dim=embedder.dim, window=4, dated=False)
    day = 86_400_000
    state.add([Message(f"m{i}", f"s{i}", 0, Role.USER, text, "", "", 1_683_504_000_000 + i * day, 0, 0, 0)
               for i, text in enumerate(turns)], embedder, True)
    lexical_only = replace(DEFAULT_RANKING, dense_weight=0.0, opener_boost=0.0, neighbours=0)
    scores = state.rank(question, embedder.embed([question])[0], "", lexical_only)
    assert int(np.argmax(scores)) == ASKED, (lang, scores)
    assert scores[ASKED] > 0


def test_a_chinese_turn_about_its_speaker_is_weighed_as_an_english_one():
    """我 ("I") and 你 / 您 ("you") give a turn its voice, as "I / my" and "you / your" do: the turn
    telling of its speaker outranks the one telling of the listener, the same words otherwise."""
    from sidecar.index.word_vectors import StaticEmbedder
    from sidecar.memory.episodic import DEFAULT_RANKING
    from sidecar.memory.episodic.index import _UserIndex

    turns = ["你上周去北京看了长城。", "我上周去北京看了长城。", "今天下雨了。"]
    embedder = StaticEmbedder()
    state = _UserIndex(dim=embedder.dim, window=4, dated=False)
    state.add([Message(f"m{i}", f"s{i}", 0, Role.USER, text, "", "", 1_683_504_000_000 + i * 86_400_000, 0, 0, 0)
               for i, text in enumerate(turns)], embedder, True)
    assert state.voice[:3].tolist() == [-1, 1, 0]
    scores = state.rank("我上周去了哪里？", None, "", DEFAULT_RANKING)
    assert scores[1] > scores[0] > 0


def test_served_recall_memory_and_knowledge_in_russian(tmp_path):
    """Over gRPC: a Russian user's turn is packed under a budget that holds one, their memory is
    found by a Russian question, and a Russian manual is found word for word (lexical score > 0)."""
    from conftest import Running

    from sidecar.api import context_service_pb2 as pb

    running = Running(str(tmp_path / "ru.duckdb"))
    try:
        stub = running.stub
        scope = pb.Scope(tenant_id="t", user_id="oleg")
        turns, question = LANGUAGES["ru"]
        for i, text in enumerate(turns):
            sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                pb.NewMessage(role=pb.ROLE_USER, text=text, client_timestamp_ms=1_683_504_000_000 + i * 86_400_000)]))
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=question, budget=pb.Budget(
            max_input=200, reserved_for_output=0, memories=45, recent_messages=0, flow_unused=False)))
        recalled = [it.text for s in resp.sections for it in s.items if it.source.startswith("message:")]
        assert recalled == ["user: " + turns[ASKED]], recalled

        stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                           content="Предпочитает зелёный чай без сахара"))
        stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                           content="Любит горные походы летом"))
        found = stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query="Какой чай он пьёт?", top_k=2))
        assert found.hits[0].memory.content == "Предпочитает зелёный чай без сахара"

        for doc_id, title, text in (("leave", "Отпуск", "Сотрудник имеет право на двадцать восемь дней отпуска."),
                                    ("vpn", "VPN", "Для подключения к сети установите клиент и введите пароль.")):
            job = stub.IngestDocument(pb.IngestDocumentRequest(scope=scope, doc_id=doc_id, title=title, text=text)).job_id
            assert stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=[job], timeout_ms=30_000)).all_finished
        kb = stub.SearchKnowledge(pb.SearchKnowledgeRequest(scope=scope, query="Сколько дней отпуска?", k=2))
        assert kb.status == pb.KNOWLEDGE_STATUS_MATCHED and kb.hits[0].doc_id == "leave"
        hits = running.app.knowledge.tenant("t").search(None, "Сколько дней отпуска?", (), 2)
        assert hits[0][0].lexical > 0
    finally:
        running.stop()


def test_a_typographic_apostrophe_names_the_speaker_and_drops_the_stopword():
    """Phones and editors write "don’t" and "Melanie’s": the same terms, and the same speaker named."""
    from sidecar.memory.episodic import DEFAULT_RANKING, terms
    from sidecar.memory.episodic.terms import names_pattern

    assert terms("I’m sure Melanie’s kids don’t mind") == terms("I'm sure Melanie's kids don't mind") == [
        "sur", "melani", "kid", "don", "mind"]
    assert names_pattern(("Melanie",)).sub("", "What did Melanie’s kids paint?") == "What did kids paint?"
    from sidecar.index.word_vectors import StaticEmbedder
    from sidecar.memory.episodic.index import _UserIndex

    embedder = StaticEmbedder()
    state = _UserIndex(dim=embedder.dim, window=4, dated=False)
    state.add([Message(f"m{i}", "s", i, Role.USER, text, "", "", 1_683_504_000_000 + i, 0, 0, 0, speaker=speaker)
               for i, (speaker, text) in enumerate([("Caroline", "We painted a lake."), ("Melanie", "We painted a lake.")])],
              embedder, True)
    mult = state._query_prior("What did Melanie’s kids paint?", DEFAULT_RANKING)
    assert mult[1] > mult[0]  # Melanie's turn, as for "Melanie's"


def test_hostile_text_in_scripts_without_spaces_is_stored_and_recalled(tmp_path):
    """Valid but hostile, on a new user and then one with history: a 255 KB Thai message (one run of
    pairs), every Hangul syllable with 8,828 CJK ideographs, 20,000 ideographs above the BMP; each is
    stored, recalled as a passage under a small budget, and the server keeps answering."""
    from conftest import Running

    from sidecar.api import context_service_pb2 as pb

    thai = ("ฉันอาศัยอยู่ที่เชียงใหม่และเป็นหมอ" * 3000)[:85_000]  # 255 KB in UTF-8, under the 256 KB limit
    hangul = "".join(chr(0xAC00 + i) for i in range(11_172)) + "".join(chr(0x4E00 + i) for i in range(8_828))
    astral = "".join(chr(0x20000 + i) for i in range(0, 60_000, 3))
    running = Running(str(tmp_path / "hostile.duckdb"))
    try:
        stub = running.stub
        scope = pb.Scope(tenant_id="t", user_id="new")
        for text in (thai, hangul, astral):
            sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
            stored = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                pb.NewMessage(role=pb.ROLE_USER, text=text)])).messages[0]
            assert stored.message_id
        for query, part in (("อาศัยอยู่ที่เชียงใหม่", "เชียงใหม่"), (hangul[5000:5010], hangul[5000:5010]),
                            (astral[100:105], astral[100:105])):
            sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id  # a question a session
            resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=query, budget=pb.Budget(
                max_input=3000, reserved_for_output=0, memories=1500, recent_messages=0, flow_unused=False)))
            recalled = [it for s in resp.sections for it in s.items if it.source.startswith("message:")]
            assert recalled and part in max(recalled, key=lambda it: it.score).text, query  # the best-scored
    finally:
        running.stop()


def test_a_knowledge_index_saved_under_another_word_rule_is_rebuilt(tmp_path):
    from sidecar.knowledge.index import TenantKnowledge
    from sidecar.text import TERMS_VERSION

    path = tmp_path / "t.kbindex"
    TenantKnowledge(64).save(path)
    assert TenantKnowledge.load(path, 64) is not None
    data = pickle.loads(path.read_bytes())
    data["terms"] = TERMS_VERSION - 1
    path.write_bytes(pickle.dumps(data))
    assert TenantKnowledge.load(path, 64) is None  # its rows are indexed again
