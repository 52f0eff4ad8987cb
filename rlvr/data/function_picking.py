"""Function picking (the seed's second experiment): given a user request and a list of available
functions, each with a JSON schema of its parameters, answer with the one function to call and,
in the harder variants, its arguments as JSON.

Knobs: `distractors`, how many other functions are listed beside the right one; `arguments`,
what the answer must hold:
- "none": only the name, `<answer>get_weather</answer>`;
- "easy": the name and the required arguments, written verbatim in the request,
  `<answer>{"name": "get_weather", "arguments": {"city": "Paris"}}</answer>`;
- "hard": also optional arguments, and values the model must convert (a company to its
  ticker, "2 hours" to 120 minutes, "dollars" to "USD").

The ground truth (`Prompt.answer`) is the expected call as JSON: `{"name": …}` alone when
arguments are not asked for, so `rlvr.rewards.structured.function_call_match` checks what is asked.
Requests are split by a hash of their text: a fixed share is held out for evaluation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from rlvr.data import chat, is_held_out, rng_state, set_rng_state
from rlvr.records import Demonstration, Prompt

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver", "Madrid", "Seoul", "Nairobi", "Toronto"]
LANGUAGES = ["French", "German", "Spanish", "Japanese", "Italian", "Swahili"]
PHRASES = ["good morning", "where is the station", "thank you very much", "I am hungry", "see you tomorrow"]
COMPANIES = {"Apple": "AAPL", "Microsoft": "MSFT", "Tesla": "TSLA", "Amazon": "AMZN", "Nvidia": "NVDA"}
CURRENCIES = {"dollars": "USD", "euros": "EUR", "yen": "JPY", "pounds": "GBP", "francs": "CHF"}
TOPICS = ["football", "elections", "space travel", "the stock market", "climate"]
INGREDIENTS = ["lentils", "chicken", "mushrooms", "tofu", "salmon", "eggplant"]
ARTISTS = ["Miles Davis", "Adele", "Bach", "Fela Kuti", "Björk"]
ROOMS = ["kitchen", "bedroom", "living room", "office", "garage"]
NAMES = ["ana", "li", "omar", "kate", "raj"]
SUBJECTS = ["lunch on Friday", "the budget", "holiday plans", "the quarterly report"]
DAYS = ["2026-01-14", "2026-03-02", "2026-07-21", "2026-11-05"]
TIMES = ["09:00", "12:30", "18:45", "20:00"]

# A request generator: (rng, hard) -> (request text, the arguments it asks for).
Generator = Callable[[random.Random, bool], tuple[str, dict]]


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    properties: dict  # JSON schema of each parameter
    required: tuple[str, ...]
    generate: Generator

    def schema(self) -> dict:
        """The function as a tool list shows it: name, description, JSON schema of its parameters."""
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": self.properties, "required": list(self.required)}}


def _weather(rng, hard):
    city = rng.choice(CITIES)
    if hard and rng.random() < 0.5:
        return f"How warm is it in {city} right now, in Fahrenheit?", {"city": city, "unit": "fahrenheit"}
    return rng.choice([f"What's the weather like in {city}?", f"Is it raining in {city} today?"]), {"city": city}


def _timer(rng, hard):
    if hard:
        hours = rng.randint(1, 3)
        return f"Set a timer for {hours} hour{'s' * (hours > 1)}.", {"minutes": 60 * hours}
    minutes = rng.randint(2, 59)
    return rng.choice([f"Set a timer for {minutes} minutes.", f"Start a {minutes} minute countdown."]), {
        "minutes": minutes}


def _currency(rng, hard):
    (src_word, src), (dst_word, dst) = rng.sample(sorted(CURRENCIES.items()), 2)
    amount = rng.choice([20, 75, 150, 1200])
    if hard:
        return f"How many {dst_word} do I get for {amount} {src_word}?", {
            "amount": amount, "from_currency": src, "to_currency": dst}
    return f"Convert {amount} {src} to {dst}.", {"amount": amount, "from_currency": src, "to_currency": dst}


def _email(rng, hard):
    to, subject = f"{rng.choice(NAMES)}@example.com", rng.choice(SUBJECTS)
    return f"Send an email to {to} with the subject '{subject}'.", {"to": to, "subject": subject}


def _translate(rng, hard):
    text, lang = rng.choice(PHRASES), rng.choice(LANGUAGES)
    return rng.choice([f"Translate '{text}' into {lang}.", f"How do you say '{text}' in {lang}?"]), {
        "text": text, "target_language": lang}


def _flights(rng, hard):
    origin, destination = rng.sample(CITIES, 2)
    day = rng.choice(DAYS)
    return f"Find me a flight from {origin} to {destination} on {day}.", {
        "origin": origin, "destination": destination, "date": day}


def _stock(rng, hard):
    company, ticker = rng.choice(sorted(COMPANIES.items()))
    if hard:
        return f"How much is one share of {company} worth today?", {"ticker": ticker}
    return f"What is {ticker} trading at?", {"ticker": ticker}


def _event(rng, hard):
    day, at = rng.choice(DAYS), rng.choice(TIMES)
    title = rng.choice(["dentist", "team sync", "yoga class", "parents' evening"])
    return f"Put '{title}' in my calendar on {day} at {at}.", {"title": title, "date": day, "time": at}


def _music(rng, hard):
    artist = rng.choice(ARTISTS)
    if hard and rng.random() < 0.5:
        return f"Shuffle some songs by {artist}.", {"artist": artist, "shuffle": True}
    return rng.choice([f"Play something by {artist}.", f"I want to listen to {artist}."]), {"artist": artist}


def _restaurant(rng, hard):
    place = rng.choice(["Chez Lina", "Blue Lotus", "Casa Verde", "The Old Mill"])
    people, at = rng.randint(2, 8), rng.choice(TIMES)
    return f"Book a table for {people} at {place} at {at}.", {"restaurant": place, "people": people, "time": at}


def _tip(rng, hard):
    bill, percent = rng.choice([24, 58, 113, 260]), rng.choice([10, 15, 18, 20])
    return f"What's a {percent}% tip on a {bill} bill?", {"bill": bill, "percent": percent}


def _news(rng, hard):
    topic = rng.choice(TOPICS)
    return rng.choice([f"What's the latest news about {topic}?", f"Any headlines on {topic}?"]), {"topic": topic}


def _recipe(rng, hard):
    ingredient = rng.choice(INGREDIENTS)
    return rng.choice([f"Give me a recipe with {ingredient}.", f"What can I cook with {ingredient}?"]), {
        "ingredient": ingredient}


def _lights(rng, hard):
    room = rng.choice(ROOMS)
    if hard and rng.random() < 0.5:
        level = rng.choice([20, 50, 80])
        return f"Dim the {room} lights to {level} percent.", {"room": room, "brightness": level}
    return f"Turn on the lights in the {room}.", {"room": room}


def _directions(rng, hard):
    origin, destination = rng.sample(CITIES, 2)
    if hard and rng.random() < 0.5:
        return f"How do I cycle from {origin} to {destination}?", {
            "origin": origin, "destination": destination, "mode": "bicycle"}
    return f"How do I get from {origin} to {destination}?", {"origin": origin, "destination": destination}


def _string(description: str) -> dict:
    return {"type": "string", "description": description}


FUNCTIONS = [
    Function("get_weather", "Current weather for a city.",
             {"city": _string("City name"), "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
             ("city",), _weather),
    Function("set_timer", "Start a countdown timer.", {"minutes": {"type": "integer"}}, ("minutes",), _timer),
    Function("convert_currency", "Convert money between currencies.",
             {"amount": {"type": "number"}, "from_currency": _string("ISO code"), "to_currency": _string("ISO code")},
             ("amount", "from_currency", "to_currency"), _currency),
    Function("send_email", "Send an email.", {"to": _string("Address"), "subject": _string("Subject line")},
             ("to", "subject"), _email),
    Function("translate_text", "Translate text into another language.",
             {"text": _string("Text to translate"), "target_language": _string("Language name")},
             ("text", "target_language"), _translate),
    Function("search_flights", "Find flights between two cities.",
             {"origin": _string("City"), "destination": _string("City"), "date": _string("YYYY-MM-DD")},
             ("origin", "destination", "date"), _flights),
    Function("get_stock_price", "Latest price of a stock.", {"ticker": _string("Ticker symbol")}, ("ticker",),
             _stock),
    Function("create_event", "Add an event to the calendar.",
             {"title": _string("Title"), "date": _string("YYYY-MM-DD"), "time": _string("HH:MM")},
             ("title", "date", "time"), _event),
    Function("play_music", "Play music by an artist.",
             {"artist": _string("Artist"), "shuffle": {"type": "boolean"}}, ("artist",), _music),
    Function("book_table", "Reserve a table at a restaurant.",
             {"restaurant": _string("Name"), "people": {"type": "integer"}, "time": _string("HH:MM")},
             ("restaurant", "people", "time"), _restaurant),
    Function("calculate_tip", "Compute a tip.", {"bill": {"type": "number"}, "percent": {"type": "number"}},
             ("bill", "percent"), _tip),
    Function("get_news", "Latest news headlines on a topic.", {"topic": _string("Topic")}, ("topic",), _news),
    Function("find_recipe", "Find recipes using an ingredient.", {"ingredient": _string("Ingredient")},
             ("ingredient",), _recipe),
    Function("set_lights", "Switch on or dim the lights of a room.",
             {"room": _string("Room"), "brightness": {"type": "integer", "minimum": 0, "maximum": 100}},
             ("room",), _lights),
    Function("get_directions", "Route between two places.",
             {"origin": _string("Place"), "destination": _string("Place"),
              "mode": {"type": "string", "enum": ["car", "bicycle", "walking"]}},
             ("origin", "destination"), _directions),
]
ARGUMENTS = ("none", "easy", "hard")
_AS_JSON = 'Reply with the call as JSON in <answer></answer> tags: {"name": ..., "arguments": {...}}.'
INSTRUCTIONS = {
    "none": "Which function should be called? Answer with its name in <answer></answer> tags.",
    "easy": _AS_JSON,
    "hard": _AS_JSON,
}


class FunctionPickingTask:
    """Prompts "here are some functions; which one serves this request?" with the expected call as answer.

    `template` must hold {functions} (the tool list, one JSON object per line) and {request}; an
    {instruction} in it becomes what the answer must hold for the chosen `arguments`.
    """

    def __init__(self, template: str, distractors: int = 3, arguments: str = "none",
                 system_prompt: str | None = None, eval_fraction: float = 0.15, eval_size: int = 64,
                 batch_size: int = 8, seed: int = 0):
        if not 0 <= distractors < len(FUNCTIONS):
            raise ValueError(f"data.distractors must be in [0, {len(FUNCTIONS) - 1}], got {distractors}")
        if arguments not in ARGUMENTS:
            raise ValueError(f"data.arguments must be one of {ARGUMENTS}, got {arguments!r}")
        if not 0 < eval_fraction < 1:
            raise ValueError(f"data.eval_fraction must be in (0, 1), got {eval_fraction}")
        for key in ("{functions}", "{request}"):
            if key not in template:
                raise ValueError(f"data.template must contain {key}: {template!r}")
        self.template, self.system_prompt = template, system_prompt
        self.distractors, self.arguments = distractors, arguments
        self.eval_fraction, self.eval_size = eval_fraction, eval_size
        self.rng = random.Random(seed)

    def _draw(self, rng: random.Random, held_out: bool) -> Prompt:
        for _ in range(10_000):
            target = rng.choice(FUNCTIONS)
            request, args = target.generate(rng, self.arguments == "hard")
            if is_held_out(request, self.eval_fraction) == held_out:
                break
        else:
            raise RuntimeError("no request found for the split")
        if self.arguments == "easy":  # only what the request states verbatim: the required arguments
            args = {k: v for k, v in args.items() if k in target.required}
        listed = rng.sample([f for f in FUNCTIONS if f is not target], self.distractors) + [target]
        rng.shuffle(listed)
        functions = "\n".join(json.dumps(f.schema(), ensure_ascii=False, separators=(",", ":")) for f in listed)
        content = (self.template.replace("{functions}", functions).replace("{request}", request)
                   .replace("{instruction}", INSTRUCTIONS[self.arguments]))
        call = {"name": target.name} if self.arguments == "none" else {"name": target.name, "arguments": args}
        return Prompt(messages=chat(content, self.system_prompt), answer=json.dumps(call, ensure_ascii=False),
                      meta={"function": target.name, "request": request, "functions": [f.name for f in listed]})

    def sample(self, n: int) -> list[Prompt]:
        return [self._draw(self.rng, held_out=False) for _ in range(n)]

    def demonstrations(self, n: int) -> list[Demonstration]:
        """The next `n` training prompts answered right, for the cold start: the expected call in
        <answer> tags (the name alone, or the JSON call when arguments are asked for)."""
        out = []
        for p in self.sample(n):
            call = json.loads(p.answer)
            answer = call["name"] if self.arguments == "none" else json.dumps(call, ensure_ascii=False)
            out.append(Demonstration(p, [{"role": "assistant", "content": f"<answer>{answer}</answer>"}]))
        return out

    def eval_prompts(self) -> list[Prompt]:
        """`eval_size` held-out prompts with distinct requests (the same for every run and seed)."""
        rng, seen, prompts = random.Random(12345), set(), []
        for _ in range(self.eval_size * 50):
            if len(prompts) == self.eval_size:
                break
            p = self._draw(rng, held_out=True)
            if p.meta["request"] not in seen:
                seen.add(p.meta["request"])
                prompts.append(p)
        return prompts

    def update(self, accuracy: float) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {"rng": rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(self.rng, state["rng"])
