"""What announces an answer in a generation, shared by every answer kind.

Strict grading (docs/grading.md) reads only an answer stated in the task's declared
format: after a marker, in a `\boxed{}` (numbers), or a reply that is the answer alone;
`stated_before_cut` is its rule for candidates the token limit stopped.

"answer is", "answer would be", "Answer:", "**Answer**:", "The right answer =", "####".
The word "answer" alone is no marker, so "To answer this, multiply 5 by 4" announces
nothing; "correct", "final", "best" before it need no listing ("The best answer is B").
"""

ANSWER_MARKER = (
    r"(?:\banswer\b[*_\s]*(?:is\b|would\s+be\b|should\s+be\b|will\s+be\b|[:=])|####)"
)


def stated_before_cut(generation: str, answer_end: int, finished: bool) -> bool:
    """Whether an answer that ends at `answer_end` was stated whole: the generation
    finished on its own (end of sequence or a stop string), or it goes on after the
    answer. A candidate stopped by the token limit right at its answer ("The answer
    is 13" of a 131) may have been cut inside it, and is not strictly graded."""
    return finished or bool(generation[answer_end:].strip())
