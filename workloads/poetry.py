"""Poetry workload: poem requests built combinatorially from form x topic x tone lists.

Every combination of a form (with its structural rules), a topic and a tone or
constraint is one prompt, phrased with one of a few request templates picked by a
hash of the combination. The id is ``poetry/<form>/<topic>/<tone>``, so ids, and
therefore the train/eval split, never change when a list grows.

Long, open-ended creative text is where a drafter is least certain, which makes this
the sampled counterpart of the greedy workloads. Defaults: temperature 0.7,
top_p 1.0 and a 768-token output cap. top_p stays at 1.0 so that the processed target
distribution differs from the raw one by the temperature alone: the measured acceptance
then reflects one knob, and lossless rejection sampling is exercised over the full
support instead of a truncated one.
"""

from __future__ import annotations


from .base import Prompt, Workload, pick_by_id, refuse_path, user_turn_prompt

# key -> (name used in the request, structural rules stated to the model)
FORMS: dict[str, tuple[str, str]] = {
    "sonnet": ("a Shakespearean sonnet", "fourteen lines of iambic pentameter rhymed ABAB CDCD EFEF GG"),
    "petrarchan": ("a Petrarchan sonnet", "an octave rhymed ABBAABBA followed by a sestet that turns the argument"),
    "haiku_sequence": ("a sequence of five haiku", "each haiku in three lines of five, seven and five syllables"),
    "villanelle": ("a villanelle", "nineteen lines: five tercets and a quatrain, with two refrains that alternate"),
    "limerick": ("three linked limericks", "each five lines rhymed AABBA with a bouncing anapestic rhythm"),
    "free_verse": ("a free-verse poem", "about thirty lines with deliberate line breaks and no fixed metre"),
    "ballad": ("a ballad", "at least eight quatrains rhymed ABCB that tell a story with a clear ending"),
    "ode": ("an ode", "several stanzas that address the subject directly and praise it"),
    "ghazal": ("a ghazal", "seven couplets, each ending on the same refrain word"),
    "sestina": ("a sestina", "six six-line stanzas and a three-line envoi rotating the same six end words"),
    "prose_poem": ("a prose poem", "three dense paragraphs without line breaks"),
    "terza_rima": ("a poem in terza rima", "tercets rhymed ABA BCB CDC, closing on a couplet"),
    "pantoum": ("a pantoum", "quatrains where lines two and four of each stanza become lines one and three of the next"),
    "cinquain_sequence": ("a sequence of four cinquains", "each five lines of two, four, six, eight and two syllables"),
    "elegy": ("an elegy", "measured stanzas that move from grief toward some consolation"),
    "acrostic": ("an acrostic poem", "the first letters of the lines spell a word connected to the subject"),
}

TOPICS: dict[str, str] = {
    "lighthouse_keeper": "the last night of a lighthouse keeper before automation",
    "sourdough": "keeping a sourdough starter alive through a long winter",
    "night_train": "a night train crossing a border",
    "grandmother_hands": "a grandmother's hands kneading dough",
    "tide_pools": "life in the tide pools at low tide",
    "city_rain": "the first rain after a heat wave in a crowded city",
    "old_computer": "an old computer being switched on after twenty years",
    "migrating_geese": "geese migrating over a motorway",
    "library_closing": "a small town library on its final day",
    "first_snow": "the first snow seen by a child from the tropics",
    "beekeeping": "a beekeeper opening a hive in spring",
    "deep_sea": "creatures of the deep sea that never see light",
    "moon_landing": "watching the moon landing on a borrowed television",
    "market_morning": "a fish market before dawn",
    "abandoned_orchard": "an abandoned orchard still bearing fruit",
    "violin_maker": "a violin maker choosing wood",
    "desert_bloom": "the desert blooming after a rare storm",
    "hospital_night_shift": "a nurse on the night shift",
    "childhood_bicycle": "learning to ride a bicycle",
    "volcano": "a village living beside a dormant volcano",
    "ferry_crossing": "a short ferry crossing in fog",
    "glacier_retreat": "a glacier retreating up its valley",
    "chess_park": "two old rivals playing chess in a park",
    "power_outage": "a neighbourhood during a power outage",
    "letters_in_attic": "a box of letters found in an attic",
    "first_job": "the first day at a first job",
    "mountain_hut": "a storm night in a mountain hut",
    "lost_language": "the last speaker of a language",
    "subway_musician": "a musician playing in a subway station",
    "harvest_moon": "farmers working under a harvest moon",
    "satellite": "a weather satellite watching the planet turn",
    "bakery_dawn": "a bakery at four in the morning",
    "wildfire_smoke": "a summer dimmed by distant wildfire smoke",
    "mapmaker": "a mapmaker drawing a coastline that keeps changing",
    "wedding_dance": "the first dance at a wedding",
    "empty_stadium": "an empty stadium the morning after a final",
    "octopus": "the intelligence of an octopus",
    "river_delta": "a river reaching its delta",
    "clockmaker": "a clockmaker repairing a clock that belonged to his father",
    "autumn_leaves": "raking autumn leaves with a sibling",
    "space_station": "an astronaut watching sunrise sixteen times a day",
    "refugee_suitcase": "what fits into a single suitcase when leaving home",
    "coral_reef": "a coral reef losing its colour",
    "snowed_in": "a family snowed in for a week",
    "garden_soil": "the life hidden in a handful of garden soil",
    "radio_station": "a late-night radio host and the listeners who call",
    "bridge_builders": "workers who built a suspension bridge",
    "owl_hunt": "an owl hunting over a frozen field",
    "recovery": "recovering slowly from a long illness",
    "street_food": "a street food stall that has stood in one place for forty years",
    "solar_eclipse": "a total solar eclipse seen from a hillside",
    "dog_aging": "an old dog that can no longer climb the stairs",
    "printing_press": "the first printed book in a small country",
    "monsoon": "the arrival of the monsoon",
    "silk_road": "a caravan resting at an oasis",
    "quantum": "the strangeness of quantum superposition",
    "ice_skating": "skating on a frozen lake for the first time",
    "cartography_of_memory": "a childhood home remembered room by room",
    "tea_ceremony": "preparing tea for a guest who is late",
    "shipwreck": "a shipwreck that has become a reef",
    "night_nurse_owls": "owls calling outside a maternity ward",
    "robot_gardener": "a robot learning to tend a garden",
    "marathon": "the last mile of a marathon",
    "mother_tongue": "speaking a mother tongue after years abroad",
    "thunderstorm": "a thunderstorm rolling over the plains",
    "inventor": "an inventor whose machine finally works",
    "fog_harbour": "a harbour town wrapped in fog",
    "pottery": "a potter centring clay on the wheel",
    "midnight_kitchen": "a kitchen at midnight after a party",
    "starling_murmuration": "a murmuration of starlings at dusk",
}

TONES: dict[str, str] = {
    "tender": "Keep the tone tender and quiet.",
    "joyful": "Make it exuberant and joyful.",
    "melancholy": "Let a gentle melancholy run through it.",
    "humorous": "Make it funny, with a twist in the last lines.",
    "solemn": "Give it a solemn, ceremonial voice.",
    "angry": "Let it burn with controlled anger.",
    "hopeful": "End on a note of hope.",
    "nostalgic": "Make it nostalgic without being sentimental.",
    "eerie": "Give it an eerie, unsettling atmosphere.",
    "second_person": "Write it in the second person, addressing 'you' throughout.",
    "child_voice": "Write it in the voice of a ten-year-old child.",
    "no_adjectives": "Use as few adjectives as possible; let the verbs carry the images.",
    "colour_motif": "Thread a single colour through the poem as a recurring motif.",
    "dialogue": "Build it as a dialogue between two voices.",
    "one_sentence": "Make the poem a single long sentence if the form allows, otherwise as few sentences as possible.",
    "senses": "Appeal to all five senses, each at least once.",
    "plain_words": "Use only plain everyday words, nothing a twelve-year-old would not know.",
    "mythic": "Give it the grandeur of a myth retold.",
    "ironic": "Keep a dry, ironic distance from the subject.",
    "title_and_note": "Give it a title and add a two-sentence note afterwards explaining one choice you made.",
    "present_tense": "Keep every verb in the present tense.",
    "object_voice": "Let an object in the scene be the speaker.",
}

REQUEST_TEMPLATES = (
    "Write {form} about {topic}. Follow the form: {rules}. {tone}",
    "Please compose {form} on the subject of {topic}. The form requires {rules}. {tone}",
    "I'd love {form} about {topic}. Stick to {rules}. {tone} Only give the poem.",
    "Could you write {form}? The subject is {topic}. Formal rules: {rules}. {tone}",
)


def _template_for(prompt_id: str) -> str:
    return pick_by_id(prompt_id, REQUEST_TEMPLATES)


class PoetryWorkload(Workload):
    """Every form x topic x tone combination as a single-turn chat request."""

    NAME = "poetry"

    def load_pool(self) -> list[Prompt]:
        refuse_path("the poetry workload", self.spec.path, "the 'custom' workload for a JSONL file")
        pool = []
        for form_key, (form, rules) in FORMS.items():
            for topic_key, topic in TOPICS.items():
                for tone_key, tone in TONES.items():
                    prompt_id = f"poetry/{form_key}/{topic_key}/{tone_key}"
                    text = _template_for(prompt_id).format(form=form, topic=topic, rules=rules, tone=tone)
                    pool.append(user_turn_prompt(prompt_id, text, f"poetry:{form_key}"))
        return pool


__all__ = ["FORMS", "PoetryWorkload", "REQUEST_TEMPLATES", "TONES", "TOPICS"]
