"""Executes a notebook top to bottom with this interpreter's kernel, failing if any cell fails.

usage: python run_notebook.py NOTEBOOK.ipynb [OUTPUT.ipynb]

The kernel is this interpreter (the test venv, where memest is installed): a kernelspec named
"memest-test" is installed into sys.prefix, which Jupyter searches, and the notebook runs on it.
"""
import subprocess
import sys

import nbclient
import nbformat

KERNEL = "memest-test"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", sys.prefix,
                    "--name", KERNEL, "--display-name", "memest (test)"],
                   check=True, stdout=subprocess.DEVNULL)
    nb = nbformat.read(sys.argv[1], as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name=KERNEL,
                            resources={"metadata": {"path": "."}}).execute()
    if len(sys.argv) > 2:
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nbformat.write(nb, sys.argv[2])
    print(f"{sys.argv[1]}: all {len(nb.cells)} cells ran")
    print("notebook: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
