"""README.md's table of supported models is the one the code generates."""

from pathlib import Path

from pagoda_runtime.loading.supported_models import table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_holds_the_generated_table_of_supported_models():
    assert table() in README.read_text(), (
        "README.md's supported-model table is stale; regenerate it with "
        "python -m pagoda_runtime.loading.supported_models"
    )
