"""Prompts of exactly `context_len` tokens, encoded the way each engine takes them.

    build_prompt(probe: ProbeSpec, engine: EngineKind, model_path: str | None = None, request=0) -> Prompt
        predictable = the sentence repeated; novel = seeded words with no repeated word n-gram
        (NOVEL_NGRAM); file = a text file, or JSONL whose lines carry "text". The encoding is the engine's
        adapter's `prompt_encoding` (`workers.adapter.PromptEncoding`): token ids of exactly context_len from
        its tokenizer (the reference engine's own: bytes for tiny, the GGUF's BPE for smollm2-135m; SGLang's
        transformers tokenizer when it loads here), else text (~CHARS_PER_TOKEN chars a token) and the engine's
        reported prompt_tokens is what gets recorded. Which engine's encoding a run gets is its adapter's
        `prompt_kind` (the stub engine takes the reference engine's bytes).
    build_prompts(probe, engine, model_path) -> [Prompt, ...]   one per request of a run (probe.concurrency)
    repeat=r (both): the r-th of probe.repeats texts of the same kind: predictable = another seeded sentence of as
        many words, repeated; novel = another seed; file = the file from r/repeats of its length on, wrapped
    probe.task (both): a closing instruction. The prompt is then one user turn of the model's chat template: the
        probe's text, a blank line, the task; the assistant's turn opened. Still exactly context_len tokens (the
        text is cut to fit between the template's frame). A model with no chat template is a ValueError.
    Prompt (workers.http_client): input_ids or text, the /generate request's prompt field
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Iterator

from specsweep_common.spec import EngineKind, ProbeKind, ProbeSpec
from workers.http_client import Prompt
from workers.registry import adapter_for

logger = logging.getLogger(__name__)

NOVEL_NGRAM = 3  # no word trigram appears twice in novel text
CHARS_PER_TOKEN = 4  # SGLang without a local tokenizer: a rough text length per requested token
LINE_REACH = 2000  # a file probe's repeat starts at a line start this near, else at a word start
MAX_TEXT_DOUBLINGS = 6  # a tokenizer giving < 1 token per 256 chars is not a text tokenizer

_VOCAB = tuple("""
able about above across act add after again against age ago agree air all allow almost alone along already
also always among amount and animal answer any appear apply area argue arm army around arrive art ask away
baby back bad bag ball bank bar base bear beat beautiful bed before begin behind believe best better between
big bill bird black blood blue board boat body book born both box boy break bring brother brown build burn
business buy call camera campaign can car card care carry case catch cause cell center chair chance change
charge check child choice church city civil claim class clear close coach cold collect color come common
community company compare contain control cost could country couple course court cover create crime cultural
cup current cut dark data daughter day dead deal death debate decade decide deep defense degree describe design
detail develop die different dinner direction discover discuss disease doctor dog door down draw dream drive
drop drug during early east easy eat economy edge effect effort eight either election else employee end energy
enjoy enough enter entire environment evening event every evidence exactly example expect experience expert
explain eye face fact factor fail fall family far fast father fear federal feel few field fight figure fill film
final find fine finger finish fire firm first fish five floor fly focus follow food foot force foreign forget
form former forward four free friend front fruit full fund future game garden gas general girl give glass goal
good green ground group grow guess gun guy hair half hand hang happen happy hard hat head health hear heart heat
heavy help here high hill history hit hold home hope horse hospital hot hotel hour house huge human hundred
idea image imagine impact improve include increase indeed inside instead interest island issue item job join
judge jump just keep key kid kill kind kitchen know lake land language large last late laugh law lawyer lay lead
learn leave left leg legal less letter level lie life light like likely line list listen little live local long
look lose loss lot love low machine magazine main maintain major make manage many map market marriage material
matter maybe mean measure media medical meet member memory mention message metal method middle might military
milk mind minute miss model modern moment money month moon morning mother mountain mouth move movie much music
must name nation natural nature near need network never new news next nice night nine noise north note nothing
notice number ocean offer office often oil old once one open option orange order other outside over owner page
pain paint paper parent park part party pass past patient pattern pay peace people per perform period person
phone physical pick picture piece place plan plant play point police policy poor popular position power
practice prepare present press pretty prevent price private problem process produce program project protect
prove provide public pull purpose push quality question quick quiet race radio rain raise range rate reach read
ready real reason receive record red reduce region relate remain remember remove report rest result return reveal
rich right rise risk river road rock role room rule run safe same save say scene school science score sea season
seat second section see seek sell send sense serve service set seven shake share she shoot short shot shoulder
show side sign silver simple since sing single sister sit site six size skill skin small smile snow social soft
soldier some son song soon sort sound south space speak special spend sport spring staff stage stand star start
state station stay step still stock stone stop store story street strong student study style subject success
such suddenly summer sun support sure surface system table take talk task teach team tell ten term test than
thank theory thing think third three through throw time today together tonight top total tough toward town trade
train travel tree trial trip trouble true truth try turn two type under unit until up upon use usual valley value
various very victim view visit voice vote wait walk wall want war watch water wave way weapon wear week weight
well west what wheel when where which while white whole why wide wife will win wind window winter wish with
within without woman wonder wood word work world worry write wrong yard year yellow yes yet young
""".split())


# ---------------------------------------------------------------- prompt text


def predictable_text(sentence: str, min_chars: int) -> str:
    reps = -(-min_chars // max(1, len(sentence)))
    return sentence * max(1, reps)


def novel_words(seed: int, n: int = NOVEL_NGRAM) -> Iterator[str]:
    """Seeded words from _VOCAB in which no word n-gram occurs twice (a redraw replaces a repeat)."""
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    window: list[str] = []
    while True:
        for _ in range(1000):
            word = rng.choice(_VOCAB)
            gram = tuple(window[-(n - 1):] + [word]) if n > 1 else (word,)
            if len(gram) < n or gram not in seen:
                break
        else:  # cannot happen before ~len(_VOCAB)**n words; never loop forever
            raise RuntimeError(f"novel text exhausted its {n}-grams")
        if len(gram) == n:
            seen.add(gram)
        window.append(word)
        del window[:-(n - 1) or None]
        yield word


def novel_text(seed: int, min_chars: int) -> str:
    """Sentences of 8-15 seeded words, capitalised and ended with a period, at least `min_chars` long."""
    rng = random.Random(seed ^ 0x5EED)
    parts: list[str] = []
    total = 0
    words = novel_words(seed)
    while total < min_chars:
        sentence = [next(words) for _ in range(rng.randint(8, 15))]
        text = " ".join(sentence).capitalize() + ". "
        parts.append(text)
        total += len(text)
    return "".join(parts)


def file_text(path: str | Path) -> str:
    """A text file as is, or the "text" fields of a JSONL file joined by blank lines."""
    p = Path(path)
    raw = p.read_text(encoding="utf-8")
    if p.suffix in (".jsonl", ".ndjson"):
        texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
        raw = "\n\n".join(texts)
    if not raw:
        raise ValueError(f"probe file {path} has no text")
    return raw


def repeat_sentence(sentence: str, repeat: int) -> str:
    """Repeat 0: `sentence`; repeat r > 0: a seeded sentence of as many words (at least 2), so the predictable probe's
    repeats are each a different sentence repeated (the same kind of text: a short period, prompt lookup finds it)."""
    if repeat == 0:
        return sentence
    words = novel_words(random.Random(f"predictable/{repeat}").getrandbits(31))
    return " ".join(next(words) for _ in range(max(2, len(sentence.split())))).capitalize() + ". "


def repeat_seed(seed: int, repeat: int) -> int:
    """Repeat 0: `seed`; repeat r > 0: a seed drawn from (seed, r), so no repeat of one point reuses another's text
    and seed s's repeats are not seed s+1's."""
    return seed if repeat == 0 else random.Random(f"novel/{seed}/{repeat}").getrandbits(31)


def rotate_file_text(text: str, repeat: int, repeats: int) -> str:
    """Repeat r of `repeats`: the file's text from r/repeats of its length on (from the next line start within
    LINE_REACH chars, else the next word), wrapping to its beginning: each repeat is another window of the file."""
    if repeat == 0:
        return text
    at = repeat * len(text) // repeats
    line, word = text.find("\n", at, at + LINE_REACH), text.find(" ", at)
    cut = next((i + 1 for i in (line, word) if 0 <= i < len(text) - 1), at)
    return text[cut:] + text[:cut]


def probe_text(probe: ProbeSpec, min_chars: int, repeat: int = 0) -> str:
    """The probe's text (`repeat`: which of its probe.repeats prompts, each a different text of the same kind)."""
    if not 0 <= repeat < max(1, probe.repeats):
        raise ValueError(f"repeat {repeat} of probe.repeats={probe.repeats}: allowed 0 .. {probe.repeats - 1}")
    if probe.kind is ProbeKind.PREDICTABLE:
        return predictable_text(repeat_sentence(probe.sentence, repeat), min_chars)
    if probe.kind is ProbeKind.NOVEL:
        return novel_text(repeat_seed(probe.seed, repeat), min_chars)
    if probe.path is None:
        raise ValueError(f"probe kind={probe.kind.value} needs probe.path, got None")
    text = rotate_file_text(file_text(probe.path), repeat, probe.repeats)
    if len(text) < min_chars:
        logger.warning("probe file %s has %d chars, fewer than the %d needed; repeating it",
                       probe.path, len(text), min_chars)
        text = text * -(-min_chars // len(text))
    return text


# ---------------------------------------------------------------- tokenisation


def build_prompt(probe: ProbeSpec, engine: EngineKind, model_path: str | None = None, request: int = 0,
                 repeat: int = 0) -> Prompt:
    """`request` i > 0 (probe.concurrency): the text starts with "Request i. ", so no two requests of a run share
    a prefix. `repeat` r (probe.repeats): the r-th text of the probe's kind (`probe_text`). The encoding is the
    engine's adapter's (`EngineAdapter.prompt_encoding`)."""
    n = probe.context_len

    def text(min_chars: int) -> str:
        return (f"Request {request}. " if request else "") + probe_text(probe, min_chars, repeat)

    encoding = adapter_for(engine).prompt_encoding(model_path, probe.task or None)
    if encoding.encode is None:
        return Prompt(text=text(n * CHARS_PER_TOKEN)[:n * CHARS_PER_TOKEN])
    encode, frame = encoding.encode, encoding.frame
    head, tail = (encode(frame[0]), encode(frame[1])) if frame else ([], [])
    room = n - len(head) - len(tail)
    if room < 1:
        raise ValueError(f"context_len={n} leaves no room for the probe text: the chat template and probe.task "
                         f"take {len(head) + len(tail)} tokens; allowed: context_len > {len(head) + len(tail)}")
    ids = _encode_exactly(text, room, encode)
    if ids is None:
        if encoding.exact or probe.task:  # a task's prompt is never sent without its frame
            raise ValueError(f"the tokenizer of {model_path} gives fewer than {n} tokens for any probe text")
        logger.warning("the tokenizer of %s gives fewer than %d tokens for any probe text; sending text",
                       model_path, n)
        return Prompt(text=text(n * CHARS_PER_TOKEN)[:n * CHARS_PER_TOKEN])
    return Prompt(input_ids=(*head, *ids, *tail))


def build_prompts(probe: ProbeSpec, engine: EngineKind, model_path: str | None = None,
                  repeat: int = 0) -> list[Prompt]:
    """One prompt per request of a run (probe.concurrency); request 0's is `build_prompt`'s."""
    return [build_prompt(probe, engine, model_path, request=i, repeat=repeat) for i in range(probe.concurrency)]


def _encode_exactly(text_of, n: int, encode) -> tuple[int, ...] | None:
    """The first n token ids of text_of(min_chars) (grown until it encodes to >= n tokens); None when the
    tokenizer still gives fewer after MAX_TEXT_DOUBLINGS (it is not a text tokenizer)."""
    text = text_of(n * CHARS_PER_TOKEN)
    ids = encode(text)
    for _ in range(MAX_TEXT_DOUBLINGS):
        if len(ids) >= n:
            return tuple(ids[:n])
        text = text_of(2 * len(text))
        ids = encode(text)
    return tuple(ids[:n]) if len(ids) >= n else None
