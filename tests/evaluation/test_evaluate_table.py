"""`python -m atr_grpo.evaluate`'s final table: per benchmark and their average, Mean@K and Pass@K ± their standard
errors, then the two parts of Mean@K (the answered rate and the accuracy given an answer) as the demo shows them."""

from atr_grpo.evaluate import format_results


def metrics(name, mean, answered, accuracy):
    values = {f"eval/{name}/mean@8": mean, f"eval/{name}/pass@8": 0.5, f"eval/{name}/mean@8_stderr": 0.01}
    values[f"eval/{name}/answered@8"] = answered
    if accuracy is not None:  # flat_metrics leaves out the accuracy given no answer
        values[f"eval/{name}/acc_given_answer@8"] = accuracy
    return values


def test_the_table_shows_the_answered_rate_and_the_accuracy_given_an_answer():
    rows = {**metrics("amc23", 0.25, 0.5, 0.5), **metrics("aime24", 0.0, 0.0, None)}
    rows |= metrics("average", 0.125, 0.25, 0.5)
    lines = format_results(rows, 8).splitlines()
    assert lines[0].split() == ["benchmark", "Mean@8", "(%)", "Pass@8", "(%)", "answered", "acc", "|", "answered"]
    assert lines[2].split() == ["aime24", "0.00", "±", "1.00", "50.00", "0.0%", "-"]  # no answer: no accuracy
    assert lines[3].split() == ["amc23", "25.00", "±", "1.00", "50.00", "50.0%", "50.0%"]
    assert lines[4].split() == ["average", "12.50", "±", "1.00", "50.00", "25.0%", "50.0%"]
    assert lines[-1] == "Mean@8 = answered × acc | answered (the share of samples with a final box × its accuracy)"
