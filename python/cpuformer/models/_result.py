"""``cpuformer.GenerationResult``: one generated sequence with its finish reason and scores
(``generate(..., return_scores=True)``), and the iterator ``stream()`` returns, which tells why
the sequence ended once it is exhausted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

#: The finish reasons, in the words of the documentation (docs/decoders.md).
FINISH_REASONS = ("eos", "stop", "length")


@dataclass(frozen=True)
class GenerationResult:
    """One returned sequence of ``generate(..., return_scores=True)``.

    token_ids: the new tokens (EOS included when produced; a stop string's sequence ends with the
    token that completed it; beam search keeps its tokens, only its text is cut).
    text: their text, cut before the first stop string, when the input was text; else None.
    finish_reason: "eos" (an EOS token ended it), "stop" (a stop string) or "length"
    (max_new_tokens: the position limit is checked before generating).
    log_probs: the log-probability of each chosen token under the processed distribution, as
    ``return_log_probs=True`` gives them (beam search: the step's beam-score increment).
    score: beam search, the hypothesis' final score, sum of its log-probabilities divided by
    length ** length_penalty (transformers' ``sequences_scores``); greedy search and sampling, the
    sum of log_probs.
    """

    token_ids: List[int]
    text: Optional[str]
    finish_reason: str
    log_probs: List[float] = field(repr=False)
    score: float


def log_probs_needed(return_log_probs: bool, return_scores: bool) -> bool:
    """Whether the C++ loop must compute log-probabilities; refuses asking for both forms."""
    if return_scores and return_log_probs:
        raise ValueError("return_scores=True already gives each sequence's log_probs (GenerationResult.log_probs); "
                         "drop return_log_probs=True")
    return bool(return_log_probs or return_scores)


def results(tokens: List[List[int]], log_probs: List[List[float]], reasons: List[str],
            beam_scores: Optional[List[float]], texts: Optional[List[str]],
            stopped: Optional[Sequence[bool]]) -> List[GenerationResult]:
    """The GenerationResults of one generate() call. texts: the (cut) texts, or None for token
    output; stopped: per sequence, whether its decoded text holds a stop string (beam search is not
    ended by one, so the C++ loop's reason says "eos" / "length" for it, but its text is cut there), or
    None."""
    out = []
    for i, (ids, lps, reason) in enumerate(zip(tokens, log_probs, reasons)):
        if stopped is not None and stopped[i]:
            reason = "stop"
        score = float(beam_scores[i]) if beam_scores is not None else float(sum(lps))
        out.append(GenerationResult(token_ids=list(ids), text=None if texts is None else texts[i],
                                    finish_reason=reason, log_probs=[float(x) for x in lps], score=score))
    return out


class StreamState:
    """What a stream's generator reports to its GenerationStream (kept apart from the stream so
    that the generator does not reference it: dropping the stream still closes the generator at
    once instead of at the next garbage collection)."""

    def __init__(self) -> None:
        self.finish_reason: Optional[str] = None
        self.num_tokens = 0


class GenerationStream(Iterator[Union[int, str]]):
    """The iterator ``stream()`` returns: tokens (or text pieces) as they are produced.

    ``finish_reason`` is None while the stream runs and after close(), and "eos", "stop" or
    "length" (as GenerationResult.finish_reason) once the iterator is exhausted; ``num_tokens``
    counts the tokens generated so far (text pieces can hold several, or part of one)."""

    def __init__(self, start: Callable[[StreamState], Iterator[Any]]) -> None:
        self._state = StreamState()
        self._pieces = start(self._state)

    def __iter__(self) -> "GenerationStream":
        return self

    def __next__(self) -> Union[int, str]:
        return next(self._pieces)

    def close(self) -> None:
        """Stops the generation (as dropping the iterator does)."""
        self._pieces.close()

    @property
    def finish_reason(self) -> Optional[str]:
        return self._state.finish_reason

    @property
    def num_tokens(self) -> int:
        return self._state.num_tokens


__all__ = ["FINISH_REASONS", "GenerationResult", "GenerationStream", "log_probs_needed", "results"]
