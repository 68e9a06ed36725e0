"""Where minies' default values come from: the papers and code the algorithms' flags (their `source=`) and the
recipes (minies/recipes.py) cite. A file of names only, so that an algorithm cites a paper without importing the
recipes; docs/papers.md prints every value with its source."""

MINIES = "minies' choice"  # a value the source does not give
QIU = "Qiu et al. 2025, countdown/"
THREEPO = "3PO paper's RL stage (Venkatkrishna et al.)"
DSM = "DeepSeekMath (Shao et al. 2024)"
