"""`zoo.summary`'s roles for an audio front-end (Whisper): its convolutions multiply (body), its fixed positions
are a table (embedding) and frozen; none of it is a head."""

from __future__ import annotations

import zoo


def test_whispers_audio_front_end_is_body_and_table_not_a_head() -> None:
    s = zoo.summary("whisper-tiny")
    model = zoo.build("whisper-tiny", device="meta", init=False)
    convs = sum(
        p.numel() for m in (model.source_embed.conv1, model.source_embed.conv2) for p in m.parameters()
    )
    positions = model.source_embed.positions.numel()  # (1500, 384): fixed sinusoids, frozen
    assert s.parameters.head == 0  # the LM head is tied; the front-end was counted here
    assert s.parameters.embedding == model.embed.tokens.weight.numel() + 448 * 384 + positions
    assert s.parameters.body == s.parameters.total - s.parameters.embedding and convs < s.parameters.body
    assert s.parameters.total - s.parameters.trainable == positions
    assert any(note.startswith(f"frozen: {positions:,} parameters") for note in s.notes)
    assert s.kv_cache_per_token > 0 and s.cross_kv_cache_per_source_token > 0  # it generates
