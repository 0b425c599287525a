"""What announces an answer in a generation, shared by every answer kind.

"answer is", "answer would be", "Answer:", "**Answer**:", "The right answer =", "####".
The word "answer" alone is no marker, so "To answer this, multiply 5 by 4" announces
nothing; "correct", "final", "best" before it need no listing ("The best answer is B").
"""

ANSWER_MARKER = (
    r"(?:\banswer\b[*_\s]*(?:is\b|would\s+be\b|should\s+be\b|will\s+be\b|[:=])|####)"
)
