"""The README's install section and the tutorial, executed as written: their code blocks, in order, in a fresh
folder, with the wheel of this checkout in a fresh virtualenv (tests/install/conftest.py), through a completed run
and its page in the admin, over HTTP, signed in.

How a block is executed, by its language:

* `sh`: its lines, as one bash script (`set -e`), in the folder the previous block ended in, the virtualenv
  active. A line that kills its worker on purpose (`DURABLERUNS_CRASH_AT=...`) must end with SIGKILL.
* `python` whose first line is `# <path>`: that file's whole text; `# <path>, at the end`: appended to it.
  Any other `python` block: typed into `python manage.py shell`.
* `text` right after an `sh` block: that block's output shows its first line (times and numbers aside).
* `cron`: not run (a crontab line).

What the test cannot do as a person does, and does instead (SUBSTITUTIONS, each of which must be used, so a
page that drifts from them fails): the virtualenv is the shared one (linked as `.venv`), the checkout's clone is
skipped and `pip install <checkout>` installs the wheel built from it, createsuperuser takes its answers from
the environment (it asks at a terminal), runserver runs in the background on a free port, and the clicks in the
admin are HTTP requests (AFTER_BLOCK).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, wait_until
from tests.install.test_wheel import free_port

pytestmark = pytest.mark.install

PASSWORD = "pw-docs-site-1"
CRASH = "DURABLERUNS_CRASH_AT="


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # where it starts in its page, for the failure's message


def code_blocks(markdown: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order, each dedented by its fence's indent (a list item's)."""
    found = []
    for match in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```$", markdown, re.MULTILINE | re.DOTALL):
        indent = len(match.group(1))
        lines = [line[indent:] for line in match.group(3).splitlines()]
        found.append(Block(match.group(2), "\n".join(lines) + "\n", markdown[: match.start()].count("\n") + 1))
    return found


def install_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- docs/install.md includes this section")
    return readme[start : readme.index("<!-- end of the install section -->")]


@dataclass
class DocSite:
    """A folder a page's commands run in, and what they left running."""

    home: Path
    venv: Path
    wheel: Path
    cwd: Path = Path()
    url: str = ""
    used: set[str] = field(default_factory=set)
    last_output: str = ""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DURABLERUNS_", "PYTHON"))}
        env.pop("DATABASE_URL", None)
        env["PATH"] = f"{self.venv / 'bin'}:{env['PATH']}"
        env["VIRTUAL_ENV"] = str(self.venv)
        return env

    def substitutions(self) -> list[tuple[str, str]]:
        """(how a line starts, what runs instead)."""
        port = self.url.rsplit(":", 1)[1]
        return [
            ("python -m venv .venv", f"ln -s {self.venv} .venv"),
            ("git clone https://github.com/durableruns/durableruns.git ../durableruns", ": clone skipped"),
            ("pip install '../durableruns[postgres]'", f"pip install --quiet '{self.wheel}[postgres]'"),
            ("pip install ../durableruns", f"pip install --quiet '{self.wheel}'"),
            (
                "python manage.py createsuperuser",
                f"DJANGO_SUPERUSER_PASSWORD={PASSWORD} python manage.py createsuperuser --noinput "
                "--username admin --email admin@example.com",
            ),
            (
                "python manage.py runserver",
                f"python manage.py runserver 127.0.0.1:{port} --noreload >{self.home}/server.log 2>&1 & "
                f"echo $! >{self.home}/server.pid",
            ),
        ]

    def line(self, line: str) -> str:
        for start, instead in self.substitutions():
            if line.startswith(start):
                self.used.add(start)
                return instead
        if line.startswith(CRASH):  # killed on purpose: 137 from the shell, anything else is a failure
            return f"{{ {line}; }} || [ $? = 137 ]"
        return line

    def sh(self, block: Block) -> None:
        script = "\n".join(self.line(line) for line in block.text.splitlines())
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", f"{script}\npwd >{self.home}/cwd"],
            cwd=self.cwd,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"block at line {block.line}:\n{block.text}\n{done.stdout}{done.stderr}"
        self.cwd = Path((self.home / "cwd").read_text().strip())
        self.last_output = done.stdout + done.stderr

    def python(self, block: Block) -> None:
        header, _, body = block.text.partition("\n")
        written = re.fullmatch(r"# ([\w./]+\.py)(, at the end)?", header)
        if written:
            path = self.cwd / written.group(1)
            if written.group(2):
                assert path.exists(), f"block at line {block.line}: {path} is not there to append to"
                path.write_text(path.read_text() + "\n" + body)
            else:
                path.write_text(block.text)
            return
        done = subprocess.run(
            [str(self.venv / "bin" / "python"), "manage.py", "shell"],
            cwd=self.cwd,
            env=self.env(),
            input=block.text,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"line {block.line}: {done.stderr}"

    def expect(self, block: Block) -> None:
        first = block.text.splitlines()[0]
        pattern = r"\d+(?:[:.]\d+)*".join(re.escape(part) for part in re.split(r"\d+(?:[:.]\d+)*", first))
        assert re.search(pattern, self.last_output), f"line {block.line}: {first!r} not in\n{self.last_output}"

    def session(self) -> requests.Session:
        """Sign in through the admin's login form, as the superuser the page made."""
        client = requests.Session()
        form = client.get(f"{self.url}/admin/login/", timeout=30)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token, form.text
        signed_in = client.post(
            f"{self.url}/admin/login/?next=/admin/",
            timeout=30,
            allow_redirects=False,
            data={"username": "admin", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1), "next": "/admin/"},
        )
        assert signed_in.status_code == 302, signed_in.text
        return client

    def served(self) -> None:
        def answers() -> bool:
            try:
                return requests.get(f"{self.url}/admin/login/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(answers, timeout=60, what=f"runserver to answer ({self.home}/server.log)")

    def stop(self) -> None:
        pid = self.home / "server.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass


def run_page(site: DocSite, blocks: list[Block], after: dict[str, Callable[[DocSite], None]]) -> None:
    previous = ""
    for block in blocks:
        if block.lang == "sh":
            site.sh(block)
        elif block.lang == "python":
            site.python(block)
        elif block.lang == "text":
            assert previous == "sh", f"line {block.line}: a text block follows no commands"
            site.expect(block)
        else:
            assert block.lang == "cron", f"line {block.line}: a {block.lang or 'bare'} block, not run: say what it is"
        for marker, action in after.items():
            if marker in block.text and block.lang == "sh":
                action(site)
        previous = block.lang


def the_run_page_shows(site: DocSite, run_id: str, *shown: str) -> None:
    """The admin's page of the run, signed in, with the admin's own CSS served."""
    client = site.session()
    page = client.get(f"{site.url}/admin/durableruns/runstate/{run_id}/change/", timeout=30)
    assert page.status_code == 200, page.text[:2000]
    for text in shown:
        assert text in page.text
    css = client.get(f"{site.url}/static/admin/css/base.css", timeout=30)
    assert css.status_code == 200 and "text/css" in css.headers["Content-Type"]


@pytest.fixture
def doc_site(
    wheel: Path, venvs: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], DocSite]]:
    made: list[DocSite] = []

    def make(name: str) -> DocSite:
        home = tmp_path_factory.mktemp(name)
        site = DocSite(home=home, venv=venvs("[postgres]"), wheel=wheel, cwd=home)
        site.url = f"http://127.0.0.1:{free_port()}"
        made.append(site)
        return site

    yield make
    for site in made:
        site.stop()


def test_the_readmes_install_section_runs_as_written(doc_site: Callable[[str], DocSite]):
    site = doc_site("readme")
    blocks = code_blocks(install_section())

    def signed_in(site: DocSite) -> None:
        site.served()
        the_run_page_shows(site, "order-1", "completed", "reserve", "notify")

    run_page(site, blocks, {"python manage.py runserver": signed_in})
    assert site.used >= {
        "python -m venv .venv",
        "pip install '../durableruns[postgres]'",
        "python manage.py createsuperuser",
        "python manage.py runserver",
    }
    assert (site.cwd / "shop" / "workflows.py").exists()


def test_the_tutorial_runs_as_written(doc_site: Callable[[str], DocSite]):
    site = doc_site("tutorial")
    blocks = code_blocks((ROOT / "docs" / "tutorial.md").read_text())

    def decide_it_happened(site: DocSite) -> None:
        """Press "It happened" on PO-1's escalation, with a note, as step 8 says."""
        site.served()
        client = site.session()
        queue = client.get(f"{site.url}/admin/durableruns/escalation/", timeout=30)
        assert queue.status_code == 200 and "PO-1" in queue.text and "notify_buyer" in queue.text
        [pk] = set(re.findall(r"/admin/durableruns/escalation/(\d+)/change/", queue.text))
        page_url = f"{site.url}/admin/durableruns/escalation/{pk}/change/"
        page = client.get(page_url, timeout=30)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert page.status_code == 200 and token, page.text[:2000]
        decided = client.post(
            page_url,
            data={"outcome": "happened", "note": "the outbox has PO-1 is confirmed", "csrfmiddlewaretoken": token[1]},
            timeout=30,
            allow_redirects=False,
        )
        assert decided.status_code == 302, decided.text[:3000]

    run_page(site, blocks, {"python manage.py runserver": decide_it_happened})
    assert site.used >= {
        "python -m venv .venv",
        "pip install ../durableruns",
        "python manage.py createsuperuser",
        "python manage.py runserver",
    }
    assert "PO-1: completed - all 3 steps complete" in site.last_output
    the_run_page_shows(site, "PO-1", "completed", "resolved by lookup", "the outbox has PO-1 is confirmed")
    charges = subprocess.run(
        [str(site.venv / "bin" / "python"), "manage.py", "shell", "-c", "from purchasing.models import Charge; "
         "print(Charge.objects.count())"],
        cwd=site.cwd, env=site.env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert charges.stdout.split()[-1] == "1", charges.stdout + charges.stderr  # one charge, after two SIGKILLs


BLOCKER = r"""
import sys, tomllib
from importlib.abc import MetaPathFinder
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT, OUT = sys.argv[1], sys.argv[2]
project = tomllib.load(open(f"{ROOT}/pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
wanted, seen = [Requirement(r) for r in project["dependencies"] + extras["docs"]], set()
while wanted:  # the docs extra's closure, through the installed distributions' own requirements
    req = wanted.pop()
    name = canonicalize_name(req.name)
    if name == "durableruns":
        wanted += [Requirement(r) for extra in req.extras for r in extras[extra]]
        continue
    if name in seen:
        continue
    seen.add(name)
    try:
        requires = distribution(name).requires or []
    except PackageNotFoundError:
        continue
    for text in requires:
        inner = Requirement(text)
        if inner.marker is None or any(inner.marker.evaluate({"extra": e}) for e in req.extras | {""}):
            wanted.append(inner)
outside = {top for top, dists in packages_distributions().items()
           if not {canonicalize_name(d) for d in dists} & seen and top != "durableruns"}

class Outside(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in outside:
            print(f"blocked: {fullname}", file=sys.stderr)
            raise ModuleNotFoundError(f"No module named {fullname!r} (not in the docs extra)", name=fullname)
        return None

sys.meta_path.insert(0, Outside())
assert "environ" in outside  # the demo's, which the docs extra does not bring
from sphinx.cmd.build import main
sys.exit(main(["-W", "--keep-going", "-q", "-b", "html", f"{ROOT}/docs", OUT]))
"""


def test_the_docs_build_with_the_docs_extra_alone(tmp_path: Path):
    """README's docs build: `pip install -e '.[docs]'` then sphinx -W. Built here with every installed module that
    the docs extra (and the app's own dependencies) does not bring made unimportable, as in a virtualenv that has
    that extra alone: no django-environ, no demo site, no psycopg; django-tasks comes with it for autodoc."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DURABLERUNS_", "DATABASE_URL"))}
    built = subprocess.run(
        [sys.executable, "-c", BLOCKER, str(ROOT), str(tmp_path / "html")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "html" / "reference" / "python.html").exists()
