"""``TokenAccounting``: what measuring a split from prepare's facts needs of an encoder.

A sample's tokens from facts are its recorded text tokens plus its placeholders' expansion
under the media geometry (``plan.facts``). That takes the vision spec, the expansion count, the
row budgets and the cost model, and the plan's fingerprint takes the encoder's identity. A
``TokenAccounting`` holds just these, either from a loaded task encoder (``of_encoder``) or from
a processor card (``of_card``, ``qwen.card``), which needs neither torch nor the processor
unless a video's expansion needs the tokenizer (then the processor is loaded once, lazily).

Qwen-Omni encoders also count their samples' sounds (``sound``, a ``qwen.sound_count.SoundCount``
at the row layout's ``max_audio_seconds`` / ``on_overlong_audio``): from the recorded sound lengths,
the same length check, frames and token rule as the online path, then the audio placeholders'
and heard videos' expansion (``placeholder_token_count(..., sound=...)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from energon_pack.config import PackingConfig
from energon_pack.identity import encoder_fingerprint_of, processor_fingerprint
from energon_pack.packing.algorithms import RowBudget
from energon_pack.packing.budget import fits_one_row, row_budget
from energon_pack.plan.facts import Facts, TextTokens, fresh_facts
from energon_pack.qwen.fit import MediaGeometry
from energon_pack.qwen.geometry import VisionSpec
from energon_pack.qwen.sound_count import SoundCount
from energon_pack.qwen.template import MediaExpansion, SoundTokens, placeholder_token_count
from energon_pack.rows.flops import CostModel, grid_rows

__all__ = ["CardFacts", "TokenAccounting", "card_facts", "expansion_counter"]


def expansion_counter(processor: Any) -> Callable[[MediaGeometry, SoundTokens | None], int]:
    """``placeholder_token_count`` of a geometry (and, Qwen-Omni, its sound tokens), memoised per
    (grids, timings, sound): one tokenizer call per distinct medium shape."""

    @lru_cache(maxsize=1 << 16)
    def count(image_grids: tuple, video_grids: tuple, timings: tuple, sound: SoundTokens | None) -> int:
        return placeholder_token_count(processor, MediaExpansion(
            image_grid_thw=np.array(image_grids, dtype=np.int64).reshape(-1, 3) if image_grids else None,
            video_grid_thw=np.array(video_grids, dtype=np.int64).reshape(-1, 3) if video_grids else None,
            videos=list(timings),
            sound=sound,
        ))

    def expansion(geometry: MediaGeometry, sound: SoundTokens | None = None) -> int:
        grids = (tuple(grid_rows(geometry.image_grid_thw)), tuple(grid_rows(geometry.video_grid_thw)))
        return count(*grids, tuple(geometry.timings), sound)

    return expansion


@dataclass(kw_only=True, eq=False)
class TokenAccounting:
    """Token accounting of one encoder for samples measured from facts.

    ``processor_fingerprint`` / ``vision`` / ``rope`` (``repr`` of the ``RopeSpec``): the
    encoder's identity parts; ``count``: placeholder tokens of a geometry and its sound tokens,
    or None where it cannot tell (then ``load`` gives the processor, whose count is used from
    then on); ``sound``: a Qwen-Omni encoder's sound accounting (None: it hears nothing).
    """

    config: PackingConfig
    processor_fingerprint: dict[str, Any]
    vision: VisionSpec
    rope: str
    count: Callable[[MediaGeometry, SoundTokens | None], int | None]
    sound: SoundCount | None = None
    cost_model: CostModel | None = None
    load: Callable[[], Any] | None = None
    #: Whether ``load`` was called (the processor was needed after all).
    loaded: bool = False
    _processor_count: Callable[[MediaGeometry], int] | None = field(default=None, repr=False)

    @classmethod
    def of_encoder(cls, encoder: Any) -> TokenAccounting:
        """The accounting of a loaded ``QwenVLPackingTaskEncoder`` (its processor counts)."""
        hearing = encoder.chat.hearing
        return cls(
            config=encoder.config, processor_fingerprint=processor_fingerprint(encoder.processor), vision=encoder.vision,
            rope=repr(encoder.rope_spec), count=expansion_counter(encoder.processor), cost_model=encoder.cost_model,
            sound=None if hearing is None else hearing.counting,
        )

    @classmethod
    def of_card(cls, card: Any, config: PackingConfig, load: Callable[[], Any]) -> TokenAccounting:
        """The accounting of the processor of ``card`` (a ``qwen.card.ProcessorCard``) under ``config``;
        ``load`` builds that processor if an expansion needs it."""
        policy = config.policy
        cost_model = None if policy.cost_model is None else CostModel.of(policy.cost_model, frozen_vision=policy.frozen_vision)
        sound = None if card.sound is None else SoundCount.of(
            card.sound.spec, card.sound.n_window, card.sound.video_second_per_grid,
            max_audio_seconds=config.row.max_audio_seconds, trim=config.row.on_overlong_audio == "trim",
        )
        return cls(
            config=config, processor_fingerprint=card.fingerprint, vision=card.vision, rope=card.rope,
            count=card.expansion, cost_model=cost_model, load=load, sound=sound,
        )

    @property
    def budget(self) -> RowBudget:
        """What one row may hold (``packing.budget.row_budget``)."""
        return row_budget(self.config.row, self.config.policy)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """``identity.encoder_fingerprint`` of the encoder accounted for."""
        return encoder_fingerprint_of(self.processor_fingerprint, self.vision, self.rope)

    def expansion(self, geometry: MediaGeometry, sound: SoundTokens | None = None) -> int:
        """Tokens the placeholders of ``geometry`` (and of ``sound``) expand to (``placeholder_token_count``)."""
        found = self.count(geometry, sound) if self._processor_count is None else None
        if found is not None:
            return found
        if self._processor_count is None:
            processor = self.load()
            if processor_fingerprint(processor) != self.processor_fingerprint:
                raise RuntimeError(
                    f"the processor loaded has fingerprint {processor_fingerprint(processor)}, its card "
                    f"{self.processor_fingerprint}; fix: delete the stale card in the processor_cards cache folder"
                )
            self._processor_count, self.loaded = expansion_counter(processor), True
        return self._processor_count(geometry, sound)

    def sound_tokens(self, audios: list[int], videos: list[int | None]) -> SoundTokens | None:
        """The sound tokens of a sample whose audios and heard videos' sound tracks have these
        lengths (``Facts.sample_sounds``; model-rate samples), None for an encoder that hears
        nothing; ``BadMediaError`` with the online path's reason (``audio_too_long``, ``empty_audio``)
        for a sample it skips. Example (Qwen2.5-Omni): ``([16000], [None])`` -> ``SoundTokens((25,), (None,), (1.0,))``."""
        if self.sound is None:
            return None
        if -1 in audios or -1 in videos:
            raise ValueError(
                "the facts record no length for a sound the processor heard (-1 in sound_samples); "
                "fix: prepare the dataset again (or plan with --measure)"
            )
        return self.sound.sound_tokens(audios, videos)

    def fits_row(self, num_tokens: int, geometry: MediaGeometry) -> bool:
        """Whether the sample fits one row (``packing.budget.fits_one_row``)."""
        return fits_one_row(num_tokens, geometry.vision_patches, self.config.row, self.config.policy)


@dataclass(frozen=True, kw_only=True, eq=False)
class CardFacts:
    """Fresh facts of a dataset with the accounting of a filed processor card (``card_facts``)."""

    accounting: TokenAccounting
    facts: Facts
    tokens: TextTokens
    key: str

    def line(self) -> str:
        """The one line saying how the samples were measured (call it after measuring: it says
        whether the processor had to be loaded after all)."""
        how = "processor loaded for its video placeholders" if self.accounting.loaded else "processor not loaded"
        return f"measured from facts (.nv-meta/energon_pack.facts.npz, fresh; processor card {self.key[:16]}, {how})"


def card_facts(dataset: Any, processor_path: Any, config: PackingConfig) -> CardFacts | None:
    """The dataset's fresh facts with the card of the processor ``load_processor(processor_path)``
    builds (``qwen.card``), accounted under ``config``; None when no card is filed for it, the
    facts are not fresh for it, or ``config`` sets ``chat_template_kwargs`` (the facts' text tokens
    hold none): then load the processor (that path says why)."""
    from energon_pack.qwen.card import ProcessorCard, processor_key

    if config.row.chat_template_kwargs:  # the facts' text tokens were measured without them
        return None
    key = processor_key(processor_path)
    card = None if key is None else ProcessorCard.load(key)
    if card is None:
        return None
    found = fresh_facts(dataset, card.fingerprint)
    if isinstance(found, str):
        return None

    def load() -> Any:
        from energon_pack.qwen.processor import load_processor

        return load_processor(processor_path)

    return CardFacts(accounting=TokenAccounting.of_card(card, config, load), facts=found[0], tokens=found[1], key=key)
