"""Memory (hunt): verl's agent-loop encoders were cached in a module dict keyed by
``(id(processor), settings)`` whose values held the processor, so a processor given to
`mmpipe.hosts.verl_agent` (and its encoders, with their render caches) was never freed. The
cache now lives on the processor itself (`verl_agent._encoder_cache`). A weak-keyed module dict
would not do: its value, the Encoder, holds the processor (checked below). Counted with weakref,
not timed; runs without verl (only the encoder cache is exercised)."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

from mmpipe import testing
from mmpipe.hosts import verl_agent
from mmpipe.rollout.multiturn import conversation_encoder


def test_a_dropped_processor_and_its_agent_encoders_are_freed():
    proc = testing.build_processor("qwen2_vl")
    enc = verl_agent._encoder(proc, {}, {})
    assert verl_agent._encoder(proc, {}, {}) is enc  # still one Encoder per processor and settings
    other = verl_agent._encoder(proc, {"enable_thinking": False}, {"max_pixels": 200_000})
    assert other is not enc and other.chat_template_kwargs == {"enable_thinking": False}
    dead_proc, dead_enc = weakref.ref(proc), weakref.ref(enc)
    del proc, enc, other
    gc.collect()
    assert dead_proc() is None and dead_enc() is None  # the module dict kept both alive before


def test_weak_keys_alone_would_keep_the_processor():
    """Why the cache is not a WeakKeyDictionary (the tool-role cache's fix): the value holds the key."""
    proc = testing.build_processor("qwen2_vl")
    cache = weakref.WeakKeyDictionary()
    cache[proc] = conversation_encoder(proc, {})
    dead = weakref.ref(proc)
    del proc
    gc.collect()
    assert dead() is not None


def test_copies_and_pickles_of_the_processor_carry_no_encoders():
    proc = testing.build_processor("qwen2_vl")
    verl_agent._encoder(proc, {}, {})
    assert "encoders" not in proc.to_json_string()  # to_dict deep-copies __dict__: an empty cache, left out
    for twin in (copy.deepcopy(proc), pickle.loads(pickle.dumps(proc))):
        assert not twin.__dict__.get(verl_agent._CACHE_ATTR)
        assert verl_agent._encoder(twin, {}, {}) is not verl_agent._encoder(proc, {}, {})
