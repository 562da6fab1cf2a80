"""Benchmark data sets in one small common shape (spec §4).

Every loader returns a :class:`Dataset`: one :class:`UserCorpus` per user (the history that PBR
personalizes with and that retrieval searches) and a list of :class:`Query` objects whose ``gold``
says which documents answer them.

``gold`` is a list of *answer elements*; each element is a list of alternative document ids, any one
of which supports that element (PersonaBench's rule, spec §4.1). Data sets without alternatives
use one id per element (``[["D1:3"], ["D2:7"]]``). :mod:`pbr_bench.metrics` scores a ranking
against every combination of one alternative per element and keeps the best.

The data are never copied into the repository. Each loader takes ``data_dir``; without it the
directory comes from the environment variable ``PBR_DATA_DIR`` (see :func:`resolve_data_dir`;
``docs/benchmarks.md`` lists the data sets, their sources and the files expected under it).

Setup:
    .. code-block:: python

        from pbr_bench.datasets import load_personabench, load_locomo, load_prefeval

        pb = load_personabench("0.0")          # 6 users, 527 documents, 263 questions (230 scored)
        corpus = pb.corpora[pb.queries[0].user_id]
        corpus.ids[:3], corpus.texts[0][:80]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = [
    "DATA_DIR_ENV",
    "LOCOMO_QUESTION_SETS",
    "PERSONABENCH_NOISE_LEVELS",
    "PREFEVAL_FORMS",
    "Dataset",
    "Doc",
    "Query",
    "UserCorpus",
    "load_locomo",
    "load_named",
    "load_pbr_generations",
    "load_personabench",
    "load_prefeval",
    "resolve_data_dir",
]

PERSONABENCH_NOISE_LEVELS: tuple[str, ...] = ("0.0", "0.3", "0.5", "0.7")
PREFEVAL_FORMS: tuple[str, ...] = ("explicit", "implicit_choice", "implicit_persona")

PrefEvalForm = Literal["explicit", "implicit_choice", "implicit_persona"]
#: Which LoCoMo questions are scored: ``"no-adversarial"`` (categories 1-4, 1,536, what the
#: harness has always scored) or ``"all"`` (every question with evidence, the adversarial
#: category 5 included, 1,982: the set published memory-system numbers use, e.g. memini's).
LoCoMoQuestions = Literal["no-adversarial", "all"]
LOCOMO_QUESTION_SETS: tuple[LoCoMoQuestions, ...] = ("no-adversarial", "all")
FillerRoles = Literal["user", "all"]


# --------------------------------------------------------------------------------------------
# Common shape
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    """One retrievable item of a user's history.

    Attributes:
        id: unique within the user's corpus (PersonaBench segment id, LoCoMo dia id, ...).
        text: what gets embedded / indexed.
        timestamp: the item's time as the data set writes it, or ``None``.
    """

    id: str
    text: str
    timestamp: str | None = None


@dataclass(frozen=True)
class Query:
    """One evaluation question, asked by ``user_id`` against that user's corpus only.

    Attributes:
        id: unique within the data set.
        user_id: key into :attr:`Dataset.corpora`.
        text: the question as the user asks it.
        category: the data set's question type (used for per-category tables).
        gold: one list of alternative doc ids per answer element (see the module docstring).
        answer: the reference answer as text, where the data set has one.
        scored: ``False`` for questions that are loaded (for example to attach generations) but
            not scored by the data set's protocol (PersonaBench's ``Subjective`` type).
    """

    id: str
    user_id: str
    text: str
    category: str
    gold: list[list[str]]
    answer: str | None = None
    scored: bool = True


@dataclass(frozen=True)
class UserCorpus:
    """One user's history, in chronological / file order."""

    user_id: str
    docs: list[Doc]

    @property
    def ids(self) -> list[str]:
        """Document ids, in corpus order."""
        return [d.id for d in self.docs]

    @property
    def texts(self) -> list[str]:
        """Document texts, in corpus order."""
        return [d.text for d in self.docs]

    def __len__(self) -> int:
        return len(self.docs)


@dataclass(frozen=True)
class Dataset:
    """A benchmark: per-user corpora and the questions asked against them.

    Attributes:
        name: e.g. ``"personabench-0.0"``, ``"locomo-turn"``, ``"prefeval-explicit-n10"``.
        corpora: user id -> that user's corpus.
        queries: every loaded question (see :attr:`Query.scored`).
        info: free-form notes on how the set was built (decisions, fixed-up ids, seeds).
    """

    name: str
    corpora: dict[str, UserCorpus]
    queries: list[Query]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def scored_queries(self) -> list[Query]:
        """The questions the protocol scores."""
        return [q for q in self.queries if q.scored]

    @property
    def num_docs(self) -> int:
        """Documents over all users."""
        return sum(len(c) for c in self.corpora.values())


# --------------------------------------------------------------------------------------------
# Data directory
# --------------------------------------------------------------------------------------------

#: The environment variable naming the folder that holds the benchmark data sets.
DATA_DIR_ENV = "PBR_DATA_DIR"

DATA_DIR_HELP = (
    f"set ${DATA_DIR_ENV} (or pass --data-dir / data_dir=...) to the folder holding the benchmark "
    "data sets (locomo/, personabench/, prefeval/, pbr-generations/; see docs/benchmarks.md)"
)


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the benchmark data sets.

    Order: the argument (``--data-dir`` on the command line); ``$PBR_DATA_DIR``. Nothing else:
    the data live outside the checkout, wherever the person running the harness put them, so
    there is no default to guess.

    Raises:
        FileNotFoundError: when neither is given, or the one given is not a directory; the message
            says what to set.
    """
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data_dir {str(path)!r} is not a directory; {DATA_DIR_HELP}")
        return path
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"${DATA_DIR_ENV}={env!r} is not a directory; fix or unset it ({DATA_DIR_HELP})"
            )
        return path
    raise FileNotFoundError(f"benchmark data directory not given: {DATA_DIR_HELP}")


@lru_cache(maxsize=64)
def _read_json_cached(path: str, mtime_ns: int) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _read_json(path: Path) -> Any:
    # Cached by path and mtime: the PrefEval filler file and the PersonaBench files are read by
    # several loaders in one session. Callers must not mutate what they get back.
    if not path.is_file():
        raise FileNotFoundError(f"expected data file {str(path)!r}; is the data dir complete?")
    return _read_json_cached(str(path), path.stat().st_mtime_ns)


# --------------------------------------------------------------------------------------------
# PersonaBench (spec §4.1)
# --------------------------------------------------------------------------------------------

_PB_COMMUNITIES = ("community_0", "community_1")
_PB_USERS_PER_COMMUNITY = 3  # the v1 release has private documents for the first 3 people only
_PB_DROPPED_KEYS = ("segment_id", "session")


def _remove_key(obj: Any, key: str) -> Any:
    """Drop ``key`` from every dict at any depth (the official chunker's behaviour)."""
    if isinstance(obj, dict):
        return {k: _remove_key(v, key) for k, v in obj.items() if k != key}
    if isinstance(obj, list):
        return [_remove_key(v, key) for v in obj]
    return obj


def personabench_segment_text(segment: dict[str, Any]) -> str:
    """The text of one PersonaBench segment, byte-identical to the official scorer's chunk.

    The segment's JSON without its ``segment_id`` and ``session`` keys (removed at every depth),
    dumped compactly (``separators=(",", ":")``, ASCII escapes, key order kept). Any other
    serialization (indentation, ``ensure_ascii=False``, a prose rendering) changes the embedding
    and moves the plain-query baseline off the published .3783 / .3074.
    """
    obj: Any = segment
    for key in _PB_DROPPED_KEYS:
        obj = _remove_key(obj, key)
    return json.dumps(obj, separators=(",", ":"))


def _answer_text(answer: Any) -> str | None:
    if answer is None:
        return None
    if isinstance(answer, str):
        return answer
    return json.dumps(answer, ensure_ascii=False)


def _pb_category(qtype: str, difficulty: str) -> str:
    # The official scorer keys categories by type and, for Preference only, difficulty
    # (Social easy/hard are one category).
    return f"Preference-{difficulty}" if qtype == "Preference" else qtype


def load_personabench(
    noise: str | float = "0.0", data_dir: str | os.PathLike[str] | None = None
) -> Dataset:
    """PersonaBench v1: 6 users, one document per session segment (spec §4.1).

    Documents are ordered as the official scorer indexes them: each user's conversations (contact
    by contact, session by session), then user-AI chats, then purchase sessions. Queries keep the
    order of ``eval_info_all.json``; ``Subjective`` questions are loaded with ``scored=False``.

    Args:
        noise: ``"0.0"``, ``"0.3"``, ``"0.5"`` or ``"0.7"`` (a float is formatted with one decimal).
            Higher levels add distractor sessions; gold ids are per level.
        data_dir: the benchmark data directory (see :func:`resolve_data_dir`).

    Returns:
        At noise 0.0: 527 documents, 263 questions, 230 scored.
    """
    noise_s = f"{noise:.1f}" if isinstance(noise, float) else str(noise)
    if noise_s not in PERSONABENCH_NOISE_LEVELS:
        raise ValueError(f"noise must be one of {PERSONABENCH_NOISE_LEVELS}, got {noise!r}")
    root = (
        resolve_data_dir(data_dir)
        / "personabench"
        / "eval_data"
        / "eval_data_v1"
        / "synthetic_data"
    )
    corpora: dict[str, UserCorpus] = {}
    queries: list[Query] = []
    for community in _PB_COMMUNITIES:
        base = root / community
        private = base / "private_data" / f"noise_{noise_s}"
        conv = {e["Name"]: e["Data"] for e in _read_json(private / "conversation_data_all.json")}
        chat = {
            e["Name"]: e["Data"] for e in _read_json(private / "user_ai_interaction_data_all.json")
        }
        buys = {
            e["Name"]: e["Data"] for e in _read_json(private / "purchase_history_data_all.json")
        }
        gold_lookup = {
            e["q_id"]: e
            for e in _read_json(base / "eval_info" / f"qa_gt_context_all_noise_{noise_s}.json")
        }
        people = _read_json(base / "eval_info" / "eval_info_all.json")[:_PB_USERS_PER_COMMUNITY]
        for person in people:
            name = person["Name"]
            segments: list[dict[str, Any]] = [
                s for contact in conv[name] for s in contact["Conversations"]
            ]
            segments += list(chat[name]) + list(buys[name])
            docs = [
                Doc(
                    id=str(s["segment_id"]),
                    text=personabench_segment_text(s),
                    timestamp=s.get("time"),
                )
                for s in segments
            ]
            corpora[name] = UserCorpus(user_id=name, docs=docs)
            for qa in person["Eval_Info"]["qa"]:
                gt = gold_lookup[qa["q_id"]]["segment_id"]
                queries.append(
                    Query(
                        id=qa["q_id"],
                        user_id=name,
                        text=qa["question"],
                        category=_pb_category(qa["type"], qa["difficulty"]),
                        gold=[[str(i) for i in alts] for alts in gt.values()],
                        answer=_answer_text(qa["answer"]),
                        scored=qa["type"] != "Subjective",
                    )
                )
    return Dataset(
        name=f"personabench-{noise_s}",
        corpora=corpora,
        queries=queries,
        info={"noise": noise_s, "text": "segment JSON without segment_id/session, compact dump"},
    )


def load_pbr_generations(
    data_dir: str | os.PathLike[str] | None = None,
) -> dict[str, tuple[list[str], str]]:
    """The PBR authors' cached gpt-4o-mini outputs for PersonaBench (spec §4.1).

    Returns:
        ``q_id -> (fake_10, reason)``: the 10 pseudo utterances and the pseudo-reasoning text,
        for all 263 questions (Subjective included). Generated from the top-5 sessions retrieved
        with multi-qa-MiniLM-L6-cos-v1 at noise 0.0; the same texts are used at every noise level.
    """
    root = resolve_data_dir(data_dir) / "pbr-generations"
    out: dict[str, tuple[list[str], str]] = {}
    for community in _PB_COMMUNITIES:
        path = root / community / "eval_info_all_PBR_multi-qa-MiniLM-L6-cos-v1.json"
        for person in _read_json(path):
            for qa in person["Eval_Info"]["qa"]:
                out[qa["q_id"]] = ([str(u) for u in qa["fake_10"]], str(qa["reason"]))
    return out


# --------------------------------------------------------------------------------------------
# LoCoMo (spec §4.2)
# --------------------------------------------------------------------------------------------

_DIA_ID = re.compile(r"^D:?(\d+):(\d+)$")


def _parse_evidence(raw: str) -> list[str]:
    """Normalise one ``evidence`` entry into canonical ``D<s>:<t>`` ids.

    The release has a few malformed entries: several ids in one string (``"D8:6; D9:17"``,
    ``"D9:1 D4:4 D4:6"``), an extra colon (``"D:11:26"``), a zero-padded turn (``"D30:05"``) and a
    bare ``"D"``. Split on ``;``/``,``/whitespace, accept ``D:<s>:<t>``, drop leading zeros; what
    still does not parse is dropped.
    """
    out = []
    for part in re.split(r"[;,\s]+", raw.strip()):
        m = _DIA_ID.match(part)
        if m:
            out.append(f"D{int(m.group(1))}:{int(m.group(2))}")
    return out


def _locomo_turn_text(turn: dict[str, Any]) -> str:
    # "Speaker: text", plus the BLIP caption of a shared photo: the caption is sometimes the only
    # place a fact lives. (LoCoMo's own RAG code writes 'X said, "..." and shared <caption>'; the
    # shorter form keeps more of a long turn inside the encoder's 256-token window.)
    text = f"{turn['speaker']}: {turn['text']}"
    caption = turn.get("blip_caption")
    if caption:
        text += f" [shared photo: {caption}]"
    return text


def load_locomo(
    level: Literal["turn", "session"] = "turn",
    data_dir: str | os.PathLike[str] | None = None,
    questions: LoCoMoQuestions = "no-adversarial",
) -> Dataset:
    """LoCoMo (locomo10): one corpus per conversation, turns or sessions as documents (spec §4.2).

    - ``level="turn"``: doc id = ``dia_id`` (``"D3:7"``), text = ``"Speaker: text"`` plus
      ``" [shared photo: <blip caption>]"`` when the turn shared a photo; timestamp = the
      session's date.
    - ``level="session"``: doc id = ``"S<n>"``, text = ``"<date>\\n"`` followed by the session's
      turns rendered as above, one per line.

    Queries (``questions``, :data:`LoCoMoQuestions`): ``"no-adversarial"``, every QA item except
    category 5 (adversarial) and empty evidence, 1,536 in total; ``"all"``, every QA item with
    evidence, 1,982 (the data set is then named ``locomo-<level>-all``). A category-5 question
    asks about something the conversation does not say, but its evidence names the turns it is
    built on, which is what a retriever is scored against. Category = ``"cat<n>"``. Gold: one
    element per evidence turn (turn level) or per distinct evidence session (session level).
    Evidence ids are normalised (see ``_parse_evidence``); at turn level ids that name no
    existing turn (``conv-42 D10:19``, ``conv-47 D4:36``) are dropped from gold (no system can
    retrieve them) but still count for their session at session level.
    ``Dataset.info["evidence_fixes"]`` lists every id that was rewritten or dropped.
    """
    if level not in ("turn", "session"):
        raise ValueError(f"level must be 'turn' or 'session', got {level!r}")
    if questions not in LOCOMO_QUESTION_SETS:
        raise ValueError(f"questions must be one of {LOCOMO_QUESTION_SETS}, got {questions!r}")
    samples = _read_json(resolve_data_dir(data_dir) / "locomo" / "locomo10.json")
    corpora: dict[str, UserCorpus] = {}
    queries: list[Query] = []
    fixes: list[dict[str, Any]] = []
    for sample in samples:
        uid = sample["sample_id"]
        conv = sample["conversation"]
        session_nums = sorted(
            int(k.split("_")[1])
            for k in conv
            if re.fullmatch(r"session_\d+", k) and isinstance(conv[k], list)
        )
        docs: list[Doc] = []
        turn_ids: set[str] = set()
        for s in session_nums:
            date = conv.get(f"session_{s}_date_time")
            turns = conv[f"session_{s}"]
            if level == "turn":
                for t in turns:
                    docs.append(Doc(id=t["dia_id"], text=_locomo_turn_text(t), timestamp=date))
            else:
                body = "\n".join(_locomo_turn_text(t) for t in turns)
                head = f"{date}\n" if date else ""
                docs.append(Doc(id=f"S{s}", text=head + body, timestamp=date))
            turn_ids.update(t["dia_id"] for t in turns)
        corpora[uid] = UserCorpus(user_id=uid, docs=docs)
        sessions = set(session_nums)
        for qi, qa in enumerate(sample["qa"]):
            adversarial = qa.get("category") == 5
            if (adversarial and questions != "all") or not qa.get("evidence"):
                continue
            ids: list[str] = []
            for raw in qa["evidence"]:
                parsed = _parse_evidence(raw)
                if parsed != [raw]:
                    fixes.append({"sample": uid, "qa": qi, "raw": raw, "parsed": parsed})
                ids.extend(parsed)
            ids = list(dict.fromkeys(ids))
            if level == "turn":
                missing = [i for i in ids if i not in turn_ids]
                if missing:
                    fixes.append({"sample": uid, "qa": qi, "raw": missing, "parsed": "dropped"})
                gold_ids = [i for i in ids if i in turn_ids]
            else:
                sess = [int(i[1:].split(":")[0]) for i in ids]
                gold_ids = [f"S{s}" for s in dict.fromkeys(sess) if s in sessions]
            if not gold_ids:  # never happens in locomo10; kept so a bad release fails loudly
                raise ValueError(f"LoCoMo {uid} qa #{qi}: no usable evidence in {qa['evidence']!r}")
            queries.append(
                Query(
                    id=f"{uid}/q{qi}",
                    user_id=uid,
                    text=qa["question"],
                    category=f"cat{qa['category']}",
                    gold=[[i] for i in gold_ids],
                    answer=_answer_text(qa.get("answer", qa.get("adversarial_answer"))),
                )
            )
    return Dataset(
        name=f"locomo-{level}" + ("-all" if questions == "all" else ""),
        corpora=corpora,
        queries=queries,
        info={"level": level, "questions": questions, "evidence_fixes": fixes},
    )


# --------------------------------------------------------------------------------------------
# PrefEval (spec §4.3)
# --------------------------------------------------------------------------------------------

_PREFEVAL_DIRS: dict[str, str] = {
    "explicit": "explicit_preference",
    "implicit_choice": "implicit_preference/choice-based",
    "implicit_persona": "implicit_preference/persona-driven",
}
PREFEVAL_N_FILLER: tuple[int, ...] = (10, 50, 100, 300)


def _filler_stream(root: Path, roles: FillerRoles) -> list[tuple[str, str]]:
    """``(id, text)`` of the filler messages in file order (LMSYS conversations, flattened)."""
    stream = []
    for ci, conv in enumerate(_read_json(root / "filtered_inter_turns.json")):
        for mi, msg in enumerate(conv["conversation"]):
            if roles == "all" or msg["role"] == "user":
                stream.append((f"filler-{ci}-{mi}", str(msg["content"])))
    return stream


def _preference_messages(item: dict[str, Any], form: str, roles: FillerRoles) -> list[str]:
    """The message(s) that carry the preference, in order."""
    if form == "explicit":
        return [item["preference"]]
    conv = item["conversation"]
    if form == "implicit_choice":
        msgs = [
            ("user", conv["query"]),
            ("assistant", conv["assistant_options"]),
            ("user", conv["user_selection"]),
            ("assistant", conv["assistant_acknowledgment"]),
        ]
    else:
        msgs = []
        for key in sorted(conv, key=int):
            msgs += [("user", conv[key]["user"]), ("assistant", conv[key]["assistant"])]
    return [str(text) for role, text in msgs if roles == "all" or role == "user"]


def load_prefeval(
    n_filler: int = 10,
    data_dir: str | os.PathLike[str] | None = None,
    form: PrefEvalForm = "explicit",
    topics: Sequence[str] | None = None,
    max_per_topic: int | None = None,
    seed: int = 0,
    roles: FillerRoles = "user",
) -> Dataset:
    """PrefEval as a needle-in-history retrieval test (spec §4.3). Every item is its own user.

    History = the preference-bearing message(s) hidden among ``n_filler`` filler messages from
    ``filtered_inter_turns.json`` (24 unrelated LMSYS chats, 316 user + 316 assistant messages).

    - Fillers are a contiguous window of the flattened filler stream (so they read like real
      conversation), starting at a seeded random offset and wrapping around. With
      ``roles="user"`` (default) only user messages are used, as the history is the user's own
      record (and as PBR's authors index user turns only on LongMemEval); ``roles="all"`` keeps
      assistant messages too (both for fillers and for implicit exchanges).
    - The preference block (one message for ``"explicit"``; the user turns of the exchange for
      the implicit forms) is inserted, contiguously, at a seeded random position in ``[0, N]``.
    - Query = the item's ``question``; gold = one element whose alternatives are the preference
      block's messages (so Recall@k of the best combination is hit@k).

    The random draws for item ``i`` of topic ``t`` depend only on ``(seed, t, i, n_filler)``:
    selecting topics or capping ``max_per_topic`` does not change the histories of the rest.

    Args:
        n_filler: filler messages per history (10, 50, 100 and 300 are the reported points).
        form: ``"explicit"``, ``"implicit_choice"`` or ``"implicit_persona"``.
        topics: topic file stems to load (default all 20).
        max_per_topic: keep the first items of each topic only.
        seed: filler window and insertion position.
        roles: ``"user"`` or ``"all"``.
    """
    if form not in _PREFEVAL_DIRS:
        raise ValueError(f"form must be one of {PREFEVAL_FORMS}, got {form!r}")
    if roles not in ("user", "all"):
        raise ValueError(f"roles must be 'user' or 'all', got {roles!r}")
    root = resolve_data_dir(data_dir) / "prefeval" / "benchmark_dataset"
    stream = _filler_stream(root, roles)
    if not 0 <= n_filler <= len(stream):
        raise ValueError(
            f"n_filler must be in [0, {len(stream)}] for roles={roles!r}, got {n_filler}"
        )
    topic_dir = root / _PREFEVAL_DIRS[form]
    available = sorted(p.stem for p in topic_dir.glob("*.json"))
    chosen = list(topics) if topics is not None else available
    unknown = sorted(set(chosen) - set(available))
    if unknown:
        raise ValueError(f"unknown PrefEval topics {unknown}; available: {available}")
    corpora: dict[str, UserCorpus] = {}
    queries: list[Query] = []
    for ti, topic in enumerate(available):
        if topic not in chosen:
            continue
        items = _read_json(topic_dir / f"{topic}.json")
        if max_per_topic is not None:
            items = items[:max_per_topic]
        for i, item in enumerate(items):
            uid = f"{topic}/{i}"
            rng = np.random.default_rng([seed, ti, i, n_filler])
            start = int(rng.integers(len(stream)))
            fillers = [stream[(start + j) % len(stream)] for j in range(n_filler)]
            pos = int(rng.integers(n_filler + 1))
            pref = [
                (f"pref-{j}", text)
                for j, text in enumerate(_preference_messages(item, form, roles))
            ]
            history = fillers[:pos] + pref + fillers[pos:]
            corpora[uid] = UserCorpus(uid, [Doc(id=d, text=t) for d, t in history])
            queries.append(
                Query(
                    id=uid,
                    user_id=uid,
                    text=item["question"],
                    category=topic,
                    gold=[[d for d, _ in pref]],
                    answer=item.get("explanation"),
                )
            )
    return Dataset(
        name=f"prefeval-{form}-n{n_filler}",
        corpora=corpora,
        queries=queries,
        info={"form": form, "n_filler": n_filler, "seed": seed, "roles": roles},
    )


def load_named(name: str, data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """The data set whose :attr:`Dataset.name` is ``name`` (``"personabench-0.7"``,
    ``"locomo-turn"``, ``"locomo-session-all"``, ``"prefeval-explicit-n50"``), loaded with the
    other arguments' defaults: result files are named by data set, so scripts that read them back
    can reload the data."""
    levels = "|".join(re.escape(level) for level in PERSONABENCH_NOISE_LEVELS)
    if m := re.fullmatch(rf"personabench-({levels})", name):
        return load_personabench(m[1], data_dir=data_dir)
    if m := re.fullmatch(r"locomo-(turn|session)(-all)?", name):
        level: Literal["turn", "session"] = "turn" if m[1] == "turn" else "session"
        return load_locomo(level, data_dir=data_dir, questions="all" if m[2] else "no-adversarial")
    forms = "|".join(PREFEVAL_FORMS)
    if m := re.fullmatch(rf"prefeval-({forms})-n(\d+)", name):
        form: PrefEvalForm = m[1]  # type: ignore[assignment]
        return load_prefeval(int(m[2]), data_dir=data_dir, form=form)
    raise ValueError(
        f"unknown data set name {name!r}; expected personabench-<noise>, locomo-turn, "
        f"locomo-session (either with -all: every question with evidence) or "
        f"prefeval-<form>-n<fillers>"
    )
