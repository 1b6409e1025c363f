//! The local crisis screen of user messages and the output check of companion messages.
//!
//! [`screen`] looks at every incoming user message for signs that a teenager is in danger: suicidal
//! ideation or self-harm, intent to hurt someone, abuse at home, or an adult grooming them. It runs on
//! every message, so it is rules only (no network, no model, a few microseconds): the text is
//! normalized, the sport's own slang and everyday hyperbole ("kill this line", "suicide no-hander",
//! "me muero de risa", "死ぬほど疲れた") are masked out, and then a set of patterns per language
//! (English, Spanish, Portuguese, French, German, Japanese) is matched. Weaker patterns give a flag
//! that is not `sure`, for a second stage to confirm.
//!
//! Each pattern is searched through one cache, which the threads take in turn (a search takes
//! microseconds). The `regex` crate would keep a cache per thread searching at once, and a cache grows
//! with the text it has seen: the labelled set grows the screen's caches by ~19 MB, on every thread.
//!
//! [`check_output`] is the same idea for what a companion is about to say: no sexual content, no
//! encouragement of or instructions for self-harm.
//!
//! The patterns are measured against the labelled set in `tests/fixtures/safety/` (see its README and
//! `companion-dev safety-eval`).

use std::borrow::Cow;
use std::sync::{LazyLock, Mutex, MutexGuard};

use regex_automata::nfa::thompson::WhichCaptures;
use regex_automata::util::iter::Searcher;
use regex_automata::util::syntax;
use regex_automata::{Input, MatchKind, PatternSet, meta};
use serde::{Deserialize, Serialize};

/// What a user message was flagged for: by the screen's layers, and by the reply model through
/// `flag_concern` (whose argument is this type, so the model is offered exactly these names and a new
/// category reaches every `match` on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
// Plain comments on the variants: doc comments would reach the model with `flag_concern`'s schema (as a
// `oneOf` of descriptions) instead of the plain enum its argument's own description explains.
pub enum Category {
    // Suicidal ideation, a plan or attempt, or self-harm.
    SelfHarm,
    // Intent to physically harm someone else.
    HarmOthers,
    // The user being abused (hit, locked up, touched) at home.
    Abuse,
    // An adult asking the user for pictures, a meeting or secrecy.
    Grooming,
}

impl Category {
    /// Every category, most urgent first (the order a message matching several is reported in).
    pub(crate) const ALL: [Category; 4] = [
        Category::SelfHarm,
        Category::HarmOthers,
        Category::Abuse,
        Category::Grooming,
    ];

    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::SelfHarm => "self_harm",
            Category::HarmOthers => "harm_others",
            Category::Abuse => "abuse",
            Category::Grooming => "grooming",
        }
    }
}

/// The screen's finding on one user message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flag {
    /// What was found.
    pub category: Category,
    /// ISO 639-1 code of the language the match was in: "en", "es", "pt", "fr", "de", "ja".
    pub(crate) lang: String,
    /// false when the rules are unsure (a weaker pattern); a second stage may be asked then.
    pub(crate) sure: bool,
}

/// What a companion message was blocked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blocked {
    /// Sexual content: never sent, whoever the user is.
    Sexual,
    /// Encouragement of self-harm, or its methods.
    SelfHarm,
}

/// A grooming cue: alone only `Explicit` is enough; the others count in combination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cue {
    /// A sexual request or the classic "mature for your age".
    Explicit,
    /// Someone asking for pictures of the user, a camera, or a meeting.
    Ask,
    /// The someone is an adult.
    Adult,
    /// Secrecy: do not tell, delete the messages.
    Secret,
}

/// What one pattern means when it matches.
#[derive(Clone, Copy, Debug)]
enum Sig {
    /// A crisis category, and whether this pattern alone is enough to be sure.
    Crisis(Category, bool),
    Groom(Cue),
}

const SH: Sig = Sig::Crisis(Category::SelfHarm, true);
const SH_: Sig = Sig::Crisis(Category::SelfHarm, false);
const HO: Sig = Sig::Crisis(Category::HarmOthers, true);
const HO_: Sig = Sig::Crisis(Category::HarmOthers, false);
const AB: Sig = Sig::Crisis(Category::Abuse, true);
const AB_: Sig = Sig::Crisis(Category::Abuse, false);
const EXPLICIT: Sig = Sig::Groom(Cue::Explicit);
const ASK: Sig = Sig::Groom(Cue::Ask);
const ADULT: Sig = Sig::Groom(Cue::Adult);
const SECRET: Sig = Sig::Groom(Cue::Secret);

/// The patterns of one language, on normalized text (lowercase, no diacritics, no apostrophes).
/// `{fam}` stands for the language's adult family members.
struct Lang {
    code: &'static str,
    fam: &'static str,
    rules: &'static [(Sig, &'static str)],
}

const EN: Lang = Lang {
    code: "en",
    fam: r"(?:my|our) (?:step ?|foster |real )?(?:dad|father|mom|mum|mother|parents?|uncle|aunt|grandpa|grandma|granddad|papa|mama|pops|old man|moms? (?:boyfriend|bf|husband)|dads? (?:girlfriend|gf|wife))s?",
    rules: &[
        (
            SH,
            r"\b(?:want|wanna|wanted|need|needed|ready|planning|plan|deserve|trying|wish i could|wish to|just wanna|really wanna)(?: to)? (?:just |really |fucking |literally |honestly )?(?:die|be dead|kill myself|kms|unalive(?: myself)?|end (?:it all|my life|myself|everything)|disappear forever|stop existing|stop living|not exist|not wake up|never wake up)\b",
        ),
        (
            SH,
            r"\b(?:going to|gonna|about to|gotta|i should|should just|finna|i will|imma|ima) (?:just |really |finally )?(?:kill myself|kms|unalive(?: myself)?|end (?:it all|my life|myself|everything)|take my (?:own )?life|hang myself|overdose)\b",
        ),
        (
            SH_,
            r"\b(?:going to|gonna|about to|finna|imma|ima) (?:just )?(?:die|end it)\b",
        ),
        (
            SH,
            r"\bwish (?:i was|i were|i wasnt|i didnt) (?:dead|never born|alive|exist)\b|\bbetter off dead\b",
        ),
        (
            SH_,
            r"\b(?:rather be dead|rather die|want to disappear|wanna disappear)\b",
        ),
        (
            SH,
            r"\b(?:no|dont have a|dont see a|dont see any|cant find a|lost my|theres no) reason (?:to|for me to) (?:live|keep going|stay alive|be alive|exist)\b|\b(?:sh-?ing|self-?harming)\b",
        ),
        (
            SH_,
            r"\bwish i could (?:just )?disappear\b|\bsleep forever\b|\bim (?:such |just )?a burden\b|\bsewer ?slide\b|\bsu[i1!*]c[i1!*]de\b|\bgoodbye (?:forever|everyone)\b|\bthis is my last (?:message|post)\b",
        ),
        (
            AB,
            r"\b{fam}\b[^.!?]{0,30}\bmakes? me (?:do (?:things|stuff)|touch)\b|\bget (?:hit|beat|beaten|hurt|slapped) at home\b",
        ),
        (
            SH,
            r"\b(?:kms|ctb|kill(?:ing|ed)? myself|killin myself|unaliv(?:e|ing) myself|end(?:ing)? my (?:own )?life|take my (?:own )?life|suicidal|commit(?:ting|ing)? suicide|catch the bus)\b",
        ),
        (
            SH,
            r"\b(?:thinking|thought|think|thinkin|thoughts) (?:about|of|abt) (?:suicide|killing myself|kms|ending (?:it|my life|it all|everything)|dying|death|unaliving|hanging myself|cutting|self ?harm)\b",
        ),
        (SH_, r"\bsuicide\b|\bunalive\b"),
        (
            SH,
            r"\b(?:been|started|start|keep|kept|still|back to|stop|started) (?:cutting|self ?harming|harming myself)\b|\b(?:im|i|was|am) (?:cutting|self ?harming|harming myself)(?: again| myself|\s*[.!]*$)",
        ),
        (
            SH,
            r"\bcut(?:ting)? (?:myself|my (?:arms?|wrists?|thighs?|skin))\b|\bcut(?:ting)? (?:again|deeper)\b",
        ),
        (
            SH_,
            r"\bcut(?:ting)? my legs?\b|\bmy (?:cuts|scars)\b|\brelaps(?:e|ed|ing)\b",
        ),
        (
            SH,
            r"\brelaps(?:e|ed|ing) (?:on |with |into )?(?:sh|self ?harm|cutting)\b|\b(?:i|im) (?:self ?harm|sh)\b|\bmy (?:sh|self ?harm)\b|\b(?:sh|self ?harm) again\b",
        ),
        (
            SH,
            r"\bhurt(?:ing)? myself (?:on purpose|again|intentionally|deliberately)\b|\b(?:want|wanna|going|gonna|need) (?:to )?hurt myself\b",
        ),
        (
            SH,
            r"\b(?:no ?one|nobody|no1)\b[^.!?]{0,20}\b(?:would|will|wud|is gonna|gonna|even) (?:even )?(?:miss me|care if i|care when i|notice if i|notice when i|notice im|cry if i)",
        ),
        (
            SH,
            r"\b(?:no ?one|nobody|no1) (?:cares|would care|will care) (?:if|whether|when) (?:im|i am|i live|i die|i was|i disappear|i\b)",
        ),
        (
            SH_,
            r"\b(?:no ?one|nobody|no1) (?:cares|loves|likes|wants) (?:about )?me\b",
        ),
        (
            SH,
            r"\b(?:everyone|everybody|every1|they|my family|the world|my parents|people|y ?all)(?:d| would| will| are| is)? (?:be|are|is)? ?better (?:off )?without me\b",
        ),
        (
            SH,
            r"\b(?:sleep|fall asleep|go to sleep) and (?:never|not) wake up\b|\b(?:dont|do not) (?:want|wanna) (?:to )?wake up\b|\bhope i dont wake up\b",
        ),
        (
            SH,
            r"\b(?:dont|do not|doesnt|never) (?:want|wanna|wish) (?:to )?(?:be alive|exist|be around|live|be here)(?: anymore| no more| any ?more)\b|\b(?:dont|do not) (?:want|wanna) (?:to )?(?:be alive|exist)\b",
        ),
        (SH_, r"\b(?:dont|do not) (?:want|wanna) (?:to )?be here\b"),
        (
            SH,
            r"\b(?:tired|sick|done|exhausted) (?:of|with) (?:living|life|being alive|existing)\b",
        ),
        (SH_, r"\b(?:tired|sick|done) of (?:everything|it all)\b"),
        (
            SH,
            r"\bwhat(?:s| is)? (?:even )?the point (?:of |in )?(?:anything|living|life|it all|going on|trying anymore|me|being alive|anymore|of me)\b",
        ),
        (SH_, r"\bwhat(?:s| is)? (?:even )?the point\s*[?.!]*\s*$"),
        (
            SH_,
            r"\b(?:cant|can not|cannot) (?:do this|take (?:it|this)|go on|keep going|handle (?:it|this|life))(?: anymore| no more)\b",
        ),
        (
            SH,
            r"\b(?:want|wanna|need) (?:it all|everything|life|my life|the pain) to (?:end|stop|be over)\b",
        ),
        (
            SH_,
            r"\b(?:want|wanna|need) (?:it|this) (?:all )?to (?:end|stop|be over)\b",
        ),
        (
            SH,
            r"\b(?:have|got|made|making|i have) a plan to (?:end it|die|kill myself|do it)\b|\bplan(?:ning)? to end it\b",
        ),
        (
            SH,
            r"\b(?:took|swallowed|taking|take|gonna take|downed|ate) (?:a bunch of|all (?:my|the|of my|of the)|too many|so many|a lot of|a whole (?:bottle|pack|box) of|like \d+|\d+) (?:of (?:my|the) )?(?:pills|meds|tablets|sleeping pills|painkillers|tylenol|advil|xanax)\b",
        ),
        (
            SH_,
            r"\b(?:suicide note|wrote (?:a|my) note|goodbye (?:note|letter))\b|\boverdos(?:e|ed|ing)\b",
        ),
        (
            SH_,
            r"\b(?:jump|jumping|throw myself|throwing myself) (?:off|from|in front of) (?:the|a|this) ?(?:bridge|roof|building|parking garage|garage|cliff|train|car|balcony|overpass)\b",
        ),
        (
            SH,
            r"\b(?:why do i|idk why i|dont know why i|why should i|why would i) (?:even )?(?:exist|live|bother living|stay alive|keep living|still alive)\b",
        ),
        (
            SH,
            r"\b(?:want|wanna|going|gonna) (?:to )?(?:hang|drown|shoot|stab|starve|burn) myself\b",
        ),
        (
            HO,
            r"\b(?:gonna|going to|will|ill|im gonna|want to|wanna|plan(?:ning)? to|about to|swear ill|swear im gonna|finna|imma|ima|really wanna) (?:go |just |fucking |actually |really )?(?:kill|murder|stab|shoot|poison|strangle|knife) (?:him|her|them|you|u|every ?one|every ?body|any ?one|some ?one|somebody|people|all of (?:them|you|y ?all)|that (?:kid|guy|dude|girl|bitch|teacher|man|woman|boy|fucker)|my (?:step ?)?(?:dad|father|mom|mother|brother|sister|teacher|coach|uncle|parents|family|ex)|his|her|[a-z]+ (?:for real|fr|i mean it|i swear|tomorrow|tonight))\b",
        ),
        (
            HO_,
            r"\b(?:gonna|going to|will|ill|im gonna|want to|wanna|plan(?:ning)? to|about to|swear ill|finna|imma|ima) (?:go |just |really |fucking )?(?:hurt|beat up|beat|jump|choke|smash|bash) (?:him|her|them|every ?one|that (?:kid|guy|dude|girl|bitch|teacher)|my (?:step ?)?(?:dad|father|mom|mother|brother|sister|teacher|coach))\b",
        ),
        (
            HO,
            r"\b(?:bring|bringing|take|taking|get|getting|grab|grabbing|got|carry|carrying)\b[^.!?]{0,25}\b(?:knife|gun|guns|pistol|rifle|glock|blade|machete)\b[^.!?]{0,25}\b(?:school|class|his house|her house|their house|party)\b",
        ),
        (
            HO,
            r"\b(?:bring|bringing|get|getting|grab|grabbing|take|taking|use|using) (?:my|his) (?:dads|moms|step ?dads|brothers|uncles|grandpas) (?:gun|rifle|pistol|knife)\b|\bget his gun\b",
        ),
        (
            HO,
            r"\bshoot(?:ing)? up (?:the |my |our |this )?(?:school|class|mall|party|church)\b",
        ),
        (
            HO,
            r"\b(?:stab|poison|strangle|murder|shoot)(?:ing|s)? (?:him|her|them|any ?one|every ?one|every1|some ?one|my (?:step ?)?(?:dad|mom|brother|sister|teacher)|that (?:kid|guy|girl|teacher)|his|her)\b",
        ),
        (
            HO,
            r"\bburn (?:his|her|their|the|my \w+s) (?:house|place|car|apartment|school) down\b|\bburn down (?:his|her|their) (?:house|place)\b",
        ),
        (
            HO,
            r"\b(?:bash|cave|smash|kick) (?:his|her|their) (?:head|skull|face) in\b",
        ),
        (
            HO,
            r"\bbeat (?:[a-z]+ ){1,3}(?:until|till|til|so bad) (?:he|she|they) (?:cant|can not|stops|dies|bleeds|is dead)\b",
        ),
        (
            HO_,
            r"\bmake (?:them|him|her|every ?one) (?:all )?pay\b|\b(?:theyre|theyll|they are|theyre all|they will) (?:all )?(?:gonna )?pay\b|\bknow where (?:he|she|they) lives?\b",
        ),
        (
            AB,
            r"\b{fam}\b[^.!?]{0,30}?\b(?:hits|hit|beats|beat|punches|punched|slaps|slapped|kicks|kicked|chokes|choked|strangles|strangled|burns|burned|burnt|whips|whipped|hurts|hurt|throws (?:stuff|things|shit|\w+) at|threw (?:stuff|things|shit|a \w+) at|touches|touched|molests|molested|rapes|raped|abuses|abused|locks|locked|smacks|smacked|starves) (?:me|my)\b",
        ),
        (
            AB,
            r"\b(?:bruises|marks|welts|a black eye|scars)\b[^.!?]{0,25}\bfrom (?:my|him|her)\b",
        ),
        (
            AB,
            r"\block(?:s|ed)? me (?:in|out)\b[^.!?]{0,40}\b(?:no food|without food|for days|no water|all night|all weekend)\b|\b{fam} (?:lock|locks|locked) me\b",
        ),
        (
            AB_,
            r"\b(?:scared|afraid|terrified|too scared|scared af) (?:to go|of going|to get|of getting) home\b",
        ),
        (
            AB,
            r"\b(?:he|she|they|hes|shes|theyre)(?:ll| will|s gonna| is gonna|re gonna| are gonna| gonna|ll just) (?:hurt|hit|beat|punch|choke|whip|slap) me\b",
        ),
        (
            AB_,
            r"\b{fam}\b[^.!?]{0,30}\b(?:calls me|says im|tells me im) (?:worthless|a mistake|useless|garbage|trash)\b",
        ),
        (
            AB,
            r"\b(?:touches|touched|touching|touch) me\b[^.!?]{0,30}\b(?:when no ?one|when nobody|at night|private|down there|where)\b|\b(?:raped|molested|sexually abused) me\b",
        ),
        (
            AB_,
            r"\bforced me to\b|\bhe (?:hits|beats|chokes|punches|slaps) me\b",
        ),
        (
            EXPLICIT,
            r"\bnudes?\b|\bnoods\b|\bfeet pics\b|\bmature for (?:my|your|ur) age\b|\bwhat (?:im|i am|i was|ur|your|youre) wearing\b|\b(?:take|taking|took) off (?:my|your|ur) (?:clothes|shirt|pants)\b|\b(?:pics?|pictures?|photos?|selfies?) (?:in|of me in) (?:my|your|ur) (?:underwear|bra|bikini|boxers)\b|\b(?:send|sending) (?:him |her |them )?(?:spicy|naughty|sexy|private|dirty) (?:pics|photos|pictures)\b",
        ),
        (
            EXPLICIT,
            r"\b(?:pics?|photos?|pictures?)\b[^.!?]{0,25}\bwithout (?:a |my )?(?:shirt|clothes)\b|\bin my underwear\b",
        ),
        (
            ASK,
            r"\b(?:ask(?:s|ed|ing)?|want(?:s|ed)?|keeps? asking|beg(?:s|ged|ging)?|tells? me to|told me to|wants me to|offer(?:s|ed|ing)?)\b[^.!?]{0,30}\b(?:pics?|pictures?|photos?|selfies?|snaps? of me|vids? of me|videos? of me)\b|\bif i send (?:him|her) (?:a )?(?:pic|pics|photo|picture|selfie)\b",
        ),
        (
            ASK,
            r"\bturn on (?:my|the|your|ur) (?:camera|cam|webcam)\b|\b(?:meet up|meet me|meet|hang out|hangout)\b[^.!?]{0,10}\balone\b|\bcome (?:to|over to|over at) his (?:place|house|apartment|car|room)\b|\boffered me money\b|\bmeet (?:up )?(?:irl|in person|in real life)\b",
        ),
        (
            ADULT,
            r"\b(?:hes|he is|shes|she is) (?:like |almost )?[2-9]\d\b|\b(?:grown|older|old|adult|man|men|way older|\d\d ?(?:year old|yr old|yo|y/o|years old)|(?:like|maybe|about) \d\d|coach|teacher|guy in his \d0s)\b",
        ),
        (
            SECRET,
            r"\b(?:dont|not to|never|do not|shouldnt|not) tell (?:my|your|ur|anyone|any ?one|no ?one|nobody)\b|\b(?:our|a) (?:little )?secret\b|\bkeep (?:it|this|our [a-z]+) (?:between us|secret|a secret)\b|\bbetween us\b|\bdelete (?:our|the|my|his|all the) (?:messages|chats?|dms|texts|convos?|pics)\b|\bso my (?:mom|dad|parents|mum) (?:wont|doesnt|dont|can not|cant) (?:see|find out|know)\b",
        ),
    ],
};

const ES: Lang = Lang {
    code: "es",
    fam: r"(?:mi|mis) (?:papa|mama|padre|madre|padrastro|madrastra|papas|padres|tio|tia|abuelo|abuela|jefe|jefa|jefes|viejo|vieja|apa|ama)|(?:el novio|la novia|el esposo|la esposa|el marido|la pareja) de mi (?:mama|madre|papa|padre|jefa)",
    rules: &[
        (
            SH,
            r"\bme quiero (?:morir|matar|suicidar|ir de este mundo)\b|\bquiero (?:morirme|matarme|suicidarme|morir|dejar de existir|desaparecer para siempre)\b|\bme quiero (?:morir|matar)(?:me)?\b",
        ),
        (
            SH,
            r"\b(?:ya )?no quiero (?:seguir )?(?:vivir|existir|despertar|seguir viv[oa]|estar viv[oa])\b|\bya no quiero (?:estar|seguir) aqui\b",
        ),
        (
            SH_,
            r"\bno quiero (?:estar|seguir) aqui\b|\bquiero desaparecer\b|\bnada tiene sentido\b|\bno le importo a nadie\b|\bya no aguanto\b",
        ),
        (
            SH_,
            r"\bya no puedo mas\b|\bme quiero ir de aqui para siempre\b",
        ),
        (
            SH,
            r"\b(?:me quiero|quiero) (?:aventar|tirar|lanzar)(?:me)? (?:del|de un|de una|de la|desde)\b|\b(?:no le veo|no tiene|sin|no le encuentro) (?:ningun )?sentido (?:a )?(?:la|mi) vida\b|\bla vida no tiene sentido\b",
        ),
        (
            SH,
            r"\b(?:ojala|quisiera|deseo) (?:no despertar|morir(?:me)?|estar muert[oa]|no haber nacido|desaparecer|no existir)\b",
        ),
        (
            SH,
            r"\bcansad[oa] de (?:vivir|la vida|existir|estar viv[oa])\b",
        ),
        (
            SH,
            r"\b(?:pensando|pienso|pense|he pensado|pensar) en (?:suicidarme|matarme|quitarme la vida|el suicidio|suicidio|morirme|tirarme|aventarme|cortarme|desaparecer|la muerte)\b",
        ),
        (
            SH,
            r"\bsuicid(?:arme|ar me)\b|\bme voy a (?:suicidar|matar)\b|\bvoy a (?:suicidarme|matarme)\b|\b(?:mejor|ya|hoy|neta) me mato\b",
        ),
        (SH_, r"\bsuicidio\b"),
        (
            SH,
            r"\bme (?:volvi a |vuelvo a |sigo |estoy )?(?:corte|corto|cortaba|cortando|cortar)\b|\bcortar(?:me)? (?:los|las|mis) (?:brazos|munecas|piernas|muslos)\b|\bcortarme\b",
        ),
        (
            SH,
            r"\bme (?:lastimo|lastime|hago dano|hice dano|autolesiono) (?:a proposito|sola|solo|cuando)\b|\bautolesi\w*|\blastimarme a proposito\b",
        ),
        (
            SH,
            r"\bnadie me (?:extranaria|va a extranar|echaria de menos|va a echar de menos|extranara)\b|\ba nadie le (?:importaria|importa|va a importar) si (?:me muero|muero|desaparezco|vivo|me mato)\b",
        ),
        (
            SH,
            r"\b(?:todos|todo el mundo|mi familia|mis papas|mis padres) (?:estarian|estaria|estaran|vivirian|seria|serian) mejor sin mi\b",
        ),
        (
            SH,
            r"\bpastillas\b[^.!?]{0,20}\b(?:listas|hoy lo hago|me las tomo)\b|\b(?:me tome|tomar|tomarme|trague|me trague) (?:todas las|un monton de|muchas|un frasco de|la caja de|un bote de) (?:pastillas|pastis|medicinas|medicamentos)\b",
        ),
        (
            SH,
            r"\b(?:acabar|terminar) con mi vida\b|\bquitarme la vida\b|\bdejar este mundo\b",
        ),
        (
            SH_,
            r"\b(?:acabar|terminar) con todo\b|\b(?:tirarme|aventarme|lanzarme) (?:del|de un|de la|desde el|desde la|por la) (?:puente|edificio|azotea|techo|ventana|balcon)\b",
        ),
        (
            SH,
            r"\bpara que (?:sigo|seguir|estoy) (?:aqui|vivo|viva|viviendo|existiendo)\b|\bpara que vivir\b",
        ),
        (
            HO,
            r"\b(?:lo|la|los|las|le|les|te) (?:voy|vamos) a (?:matar|apunalar|acuchillar|balear|quemar|envenenar|degollar|ahorcar|pegar un tiro|meter un tiro|pegar un balazo|dar un balazo)\b",
        ),
        (
            HO,
            r"\b(?:voy a|vamos a|quiero|juro que voy a|pienso|juro que lo voy a) (?:matar|apunalar|acuchillar|balear|envenenar|degollar) a (?:mi|mis|su|ese|esa|esos|todos|todas|todo el mundo|[a-z]+)\b",
        ),
        (
            HO_,
            r"\b(?:voy a|vamos a|quiero|juro que voy a) (?:lastimar|golpear|madrear|partirle la madre a|romperle la madre a) (?:a )?(?:mi|mis|su|ese|esa|todos|[a-z]+)\b",
        ),
        (HO, r"\b(?:apunal|acuchill|balear|balacear)\w*"),
        (
            HO,
            r"\b(?:pegar|meter|dar)(?:le|les)? (?:un tiro|un balazo|unos tiros|un plomazo)\b",
        ),
        (
            HO,
            r"\b(?:llevar|llevo|traer|traigo|llevare|meter|voy a llevar)\b[^.!?]{0,30}\b(?:navaja|cuchillo|pistola|arma|fusca|cuete|machete)\b[^.!?]{0,25}\b(?:escuela|colegio|cole|insti|instituto|prepa|secu|secundaria|clase|salon)\b",
        ),
        (
            HO,
            r"\b(?:voy a|vamos a|quiero|le voy a|les voy a) (?:quemar|incendiar|prender fuego a) (?:su|la|sus) (?:casa|carro|coche|escuela)\b|\b(?:poner|echar)(?:le|les)? veneno\b|\benvenen\w*",
        ),
        (
            HO,
            r"\b(?:le|les|te) voy a (?:romper|partir|reventar|abrir) (?:la cabeza|la cara|la madre|la crisma)\b",
        ),
        (
            HO,
            r"\b(?:matar|matarlos|lastimar) a (?:todos|todo el mundo)\b",
        ),
        (
            AB,
            r"\b{fam}\b[^.!?]{0,30}?\bme (?:pega|pego|pegan|pegaron|golpea|golpeo|golpean|golpearon|ahorca|ahorco|estrangula|quema|quemo|toca|toco|tocan|manosea|manoseo|abusa|abuso|viola|violo|encierra|encerro|encierran|patea|pateo|cachetea|cacheteo|lastima|lastimo|azota|avienta cosas|jala del pelo|da (?:palizas|cachetadas|golpes|bofetadas|una paliza|con el cinturon)|dio (?:una paliza|una cachetada|golpes))\b",
        ),
        (
            AB,
            r"\bme (?:pega|golpea|golpean|pegan|ahorca|toca|manosea) (?:mi|mis) (?:papa|mama|padre|madre|padrastro|madrastra|papas|padres|tio|abuelo)\b",
        ),
        (
            AB,
            r"\b(?:moretones|morados|marcas|cardenales)\b[^.!?]{0,30}\b(?:mi|mis|me pego|me golpeo|me pegaron)\b",
        ),
        (
            AB,
            r"\bme (?:encierran|encierra|encerraron|encerro)\b[^.!?]{0,30}\bsin (?:comer|comida|agua)\b",
        ),
        (
            AB_,
            r"\bmiedo (?:de|a) (?:volver|regresar|ir|llegar) a (?:mi )?casa\b",
        ),
        (
            AB,
            r"\bme (?:va|van|vuelve|vuelven) a (?:pegar|golpear|lastimar|ahorcar)\b",
        ),
        (
            EXPLICIT,
            r"\bnudes?\b|\b(?:pide|pidio|pidiendo|pedir|manda|mande|mandar|mandes|pasa|pasar|pasarle)\w* (?:el |un |tu |su |mi )?pack\b|\bfotos? (?:desnud\w*|sin ropa|en ropa interior|en calzones|en bikini|hot|intimas)\b|\bropa interior\b[^.!?]{0,20}\bfotos?\b|\b(?:quite|quitarme|quitarte|me quite) la ropa\b|\bmadur[oa] para (?:mi|tu) edad\b|\bque (?:llevo|traigo) puesto\b",
        ),
        (
            ASK,
            r"\bme (?:pide|pidio|pidieron|esta pidiendo|sigue pidiendo|anda pidiendo)\b[^.!?]{0,20}\b(?:fotos?|fotitos?|selfies?|videos? mios?)\b|\bfotos? (?:mias|mia|tuyas)\b|\b(?:quiere|queria) que (?:le )?(?:mande|envie|pase)\b[^.!?]{0,20}\bfotos?\b|\b(?:prenda|prender|encienda) (?:la|mi) (?:camara|cam)\b|\b(?:verme|vernos|quedar|salir) a solas\b|\b(?:vaya|ir) a su casa\b|\bme ofrece dinero\b",
        ),
        (
            ADULT,
            r"\b(?:senor|senores|hombre|tipo mayor|mayor|adulto|adulta|viejo|ruco|entrenador|profe|profesor|coach|\d\d anos|de \d\d|chavo de \d\d|tiene como \d\d)\b",
        ),
        (
            SECRET,
            r"\bno (?:le |les )?(?:diga|digas|cuente|cuentes|dijera|contara) (?:a )?(?:nadie|mis|tus|mi|tu)\b|\bque no le (?:diga|cuente)\b|\b(?:nuestro|un) secreto\b|\bborr(?:ar|e|ara|es|a) (?:los|nuestros|el|todos los) (?:mensajes|chats?)\b|\bpara que (?:mi|tu|mis) (?:mama|papa|madre|padre|familia|papas) no (?:los |lo )?(?:vea|vean|sepa|sepan|se entere)\b",
        ),
    ],
};

const PT: Lang = Lang {
    code: "pt",
    fam: r"(?:meu|minha|meus) (?:pai|mae|padrasto|madrasta|pais|tio|tia|avo|vo|vovo|coroa|velho|velha)|o (?:namorado|marido) da minha mae|a (?:namorada|mulher) do meu pai",
    rules: &[
        (
            SH,
            r"\b(?:eu )?(?:quero|queria|to querendo|preciso|penso em|pensando em|pensei em|vontade de) (?:morrer|me matar|sumir pra sempre|desaparecer pra sempre|me suicidar|suicidio|nao existir|me cortar|me machucar)\b",
        ),
        (
            SH,
            r"\b(?:eu )?(?:vou|vo|to indo|hoje eu vou) (?:me matar|me suicidar|acabar com (?:a )?minha vida|tirar (?:a )?minha vida)\b|\b(?:acabar com|tirar) (?:a )?minha (?:propria )?vida\b",
        ),
        (
            SH_,
            r"\b(?:quero|queria) sumir\b|\bnao aguento mais\b|\bsuicid(?:io|ar)\b",
        ),
        (
            SH,
            r"\bnao (?:quero|aguento) mais (?:viver|estar aqui|existir|acordar)\b|\bnao quero mais estar vivo\b",
        ),
        (SH, r"\bcansad[oa] de (?:viver|existir|estar viv[oa])\b"),
        (SH_, r"\bcansad[oa] de tudo\b"),
        (
            SH,
            r"\b(?:dormir|deitar) e (?:nao|nunca mais) acordar\b|\bnao acordar mais\b",
        ),
        (
            SH,
            r"\b(?:tomei|tomar|engoli|vou tomar) (?:um monte de|muitos?|todos os|todas as|varios|varias|uma cartela de|a caixa de|a cartela de) (?:remedios?|comprimidos|pilulas|calmantes)\b",
        ),
        (
            SH,
            r"\b(?:todo mundo|todos|minha familia|meus pais) (?:ficaria|ficariam|estaria|estariam|viveria|vive|seria) melhor sem mim\b",
        ),
        (
            SH,
            r"\bninguem (?:sentiria|vai sentir|ia sentir|sentira) (?:a )?(?:minha )?falta\b|\bninguem (?:liga|ligaria|se importa|se importaria) se eu (?:morrer|morresse|sumir|sumisse)\b",
        ),
        (
            SH,
            r"\bme (?:cortei|corto|cortar|cortando|cortava)\b|\bautomutila\w*|\bme mutil\w*|\bme (?:machuco|machucar|machucando|machuquei) de proposito\b",
        ),
        (
            SH,
            r"\b(?:vou|quero|vo|penso em|pensando em) (?:pular|me jogar) d[ao] (?:ponte|predio|telhado|janela|sacada)\b",
        ),
        (
            SH,
            r"\bqual (?:o|e o) sentido de (?:continuar|viver|existir)\b",
        ),
        (
            SH,
            r"\b(?:nao vejo|nao tem|sem|perdi o|nenhum) (?:mais )?sentido (?:na|da|em|pra) (?:minha )?vida\b|\ba vida nao tem (?:mais )?sentido\b",
        ),
        (
            HO,
            r"\b(?:vou|vo|quero|juro que vou|juro q vou|to pensando em|vamos) (?:matar|esfaquear|espancar|envenenar|atirar em|furar|meter bala em) (?:ele|ela|eles|elas|voce|vc|meu|minha|meus|todo mundo|todos|aquele|aquela|esse (?:cara|moleque|muleque|menino|professor|filho)|o (?:professor|cara|moleque|menino)|a professora)\b",
        ),
        (
            HO,
            r"\b(?:vou|vo|quero|juro que vou) dar (?:um tiro|uns tiros|um tiro) (?:n\w+|em)\b|\besfaque\w*|\benvenen\w*",
        ),
        (
            HO,
            r"\b(?:faca|arma|revolver|pistola|oitao|canivete|facao)\b[^.!?]{0,30}\b(?:escola|colegio|sala|aula)\b",
        ),
        (
            HO,
            r"\b(?:tacar|botar|por|colocar|meter) fogo (?:na|no) (?:casa|carro|escola|apartamento)\b",
        ),
        (
            HO,
            r"\b(?:vou|vo|quero) (?:quebrar|arrebentar|rachar) (?:a cara|a cabeca) (?:dele|dela|daquele)\b|\bmatar (?:todo mundo|todos) da (?:minha )?(?:sala|escola|turma)\b",
        ),
        (
            HO_,
            r"\b(?:vou|vo|quero) (?:bater|socar) (?:nele|nela|naquele)\b",
        ),
        (
            AB,
            r"\b{fam}\b[^.!?]{0,30}?\bme (?:bate|bateu|batem|bateram|espanca|espancou|espancam|enforca|enforcou|sufoca|queima|queimou|toca|tocou|tranca|trancam|trancou|agride|agrediu|estuprou|estupra|abusa|abusou|chuta|chutou|da tapa|deu um tapa|da surra|deu uma surra|machuca|machucou)\b",
        ),
        (
            AB,
            r"\bapanh(?:o|ei|ando|ar|a) (?:do|da|dos) (?:meu |minha |meus )?(?:pai|mae|padrasto|madrasta|pais|tio)\b|\bapanho (?:todo dia|sempre|em casa)\b",
        ),
        (
            AB,
            r"\b(?:roxo|roxa|roxos|hematomas?|marcas)\b[^.!?]{0,30}\b(?:meu|minha) (?:pai|mae|padrasto|madrasta)\b",
        ),
        (
            AB,
            r"\bme trancam?\b[^.!?]{0,30}\bsem (?:comida|comer|agua)\b",
        ),
        (
            AB_,
            r"\bmedo de (?:voltar|ir|chegar) (?:pra|para|em) casa\b",
        ),
        (
            AB,
            r"\b(?:vai|vao) me (?:bater|espancar|machucar) de novo\b|\bele vai me (?:bater|espancar)\b",
        ),
        (
            EXPLICIT,
            r"\bnudes?\b|\b(?:pedindo|pede|pediu|manda|mandar|mande)\w* (?:um |o |seu )?pack\b|\bfotos? (?:pelad[oa]|sem roupa|de calcinha|de cueca|de sutia|intimas?)\b|\b(?:calcinha|cueca)\b[^.!?]{0,15}\bfoto|\bfoto\b[^.!?]{0,15}\b(?:calcinha|cueca)\b|\btirar a roupa\b|\bmadur[oa] (?:pra|para) (?:minha|sua) idade\b|\bfotos? sem camisa\b",
        ),
        (
            ASK,
            r"\b(?:pedindo|pede|pediu|pedir|quer que eu mande)\b[^.!?]{0,15}\bfotos?\b|\bfotos? (?:minha|minhas|de mim)\b|\bligar a (?:camera|cam)\b|\b(?:me encontrar|encontrar comigo|me ver) (?:sozinh[ao]|a sos)\b|\b(?:va|ir) (?:na|pra|para a) casa dele\b|\bme ofereceu dinheiro\b",
        ),
        (
            ADULT,
            r"\b(?:mais velho|homem|adulto|tiozao|coroa|treinador|professor|\d\d anos|cara de \d\d)\b",
        ),
        (
            SECRET,
            r"\b(?:nao|sem) contar (?:pra |para |pros |pras |a )?(?:ninguem|meus|minha|meu|seus|sua)\b|\bpra eu nao contar\b|\b(?:nosso|um) segredo\b|\bsegredo nosso\b|\bapagar (?:as|nossas) (?:mensagens|conversas)\b|\bpra (?:minha|meu|meus) (?:mae|pai|pais) nao (?:ver|saber)\b",
        ),
    ],
};

const FR: Lang = Lang {
    code: "fr",
    fam: r"(?:mon|ma|mes) (?:pere|mere|daron|daronne|darons|parents|beau[- ]pere|belle[- ]mere|oncle|tante|grand[- ]pere|grand[- ]mere|papa|maman|vieux|reup)|le (?:copain|mec|compagnon|petit ami) de ma (?:mere|daronne|maman)",
    rules: &[
        (
            SH,
            r"\b(?:je |j)?(?:veux|voudrais|veut|vx|veu|jveux|jvx|jvoudrais) (?:juste |vraiment |trop |tellement )?(?:mourir|crever|me tuer|me suicider|en finir|disparaitre|plus vivre|plus etre la|plus exister|pas vivre|mettre fin a mes jours)\b",
        ),
        (
            SH,
            r"\b(?:jai|j ai) (?:trop |tellement |grave |vraiment |juste )?envie de (?:mourir|crever|me tuer|me suicider|en finir|disparaitre)\b",
        ),
        (
            SH,
            r"\b(?:pense|pensais|penser|jpense) a (?:me tuer|me suicider|mourir|en finir|la mort|sauter)\b",
        ),
        (
            SH,
            r"\b(?:vais|va|vas|veux|jvais) me (?:tuer|suicider|foutre en l ?air|pendre|jeter)\b",
        ),
        (
            SH,
            r"\b(?:scarif|automutil|mutil)\w*|\bje me (?:suis )?(?:re)?coup(?:e|ee|er|es)? (?:les |mes )?(?:bras|poignets|veines|cuisses|jambes)\b|\bje me (?:re)?coupe (?:encore|souvent|tous les)\b",
        ),
        (
            SH,
            r"\bme (?:fais|faire|fait) du mal (?:expres|volontairement|moi[- ]meme|tout seul|toute seule)\b|\bme faire du mal\b",
        ),
        (
            SH,
            r"\bpersonne (?:ne )?(?:remarquerait|verrait|se rendrait compte|me regretterait|s ?en rendrait compte|me manquerait|pleurerait|me pleurerait)\b",
        ),
        (
            SH_,
            r"\bpersonne (?:ne )?(?:maime|m aime|se soucie de moi)\b|\ba quoi bon\b|\bj ?en peux plus\b|\bsuicide\b",
        ),
        (
            SH,
            r"\b(?:tout le monde|ils|ma famille|mes parents|le monde)\b[^.!?]{0,10}\b(?:serai(?:t|ent)|irai(?:t|ent)) mieux sans moi\b",
        ),
        (
            SH,
            r"\b(?:mendormir|dormir|m endormir) et (?:ne )?(?:jamais|plus) (?:me )?reveiller\b|\bne (?:jamais|plus) me reveiller\b|\bpas me reveiller\b",
        ),
        (
            SH,
            r"\b(?:fatigue|fatiguee|marre|lasse?|epuisee?) (?:de |d ?)?(?:vivre|la vie|exister)\b|\bj ?en peux plus de (?:la vie|vivre)\b|\bras le bol de (?:la vie|vivre)\b",
        ),
        (
            SH,
            r"\bca sert a rien que je (?:vive|sois la|continue)\b|\bmettre fin a (?:mes jours|ma vie)\b|\ben finir avec (?:la vie|tout|ma vie)\b",
        ),
        (
            SH,
            r"\b(?:pas|plus) envie de vivre\b|\bplus aucune raison de vivre\b|\bla vie na (?:plus )?aucun sens\b",
        ),
        (
            SH,
            r"\b(?:vais|veux|pense a|jvais) (?:sauter|me jeter) (?:du|d ?un|de la|par la|sous un) (?:pont|immeuble|toit|balcon|fenetre|train|metro)\b",
        ),
        (
            SH,
            r"\b(?:pris|avale|prendre|avaler) (?:plein de|trop de|tous mes|toute la boite de|une boite de|toute ma boite de|des tas de) (?:cachets|medocs|medicaments|pilules|comprimes)\b",
        ),
        (
            HO,
            r"\b(?:vais|veux|vas|va|jvais|jure que je vais|jte jure je vais) (?:le|la|les|lui|leur|l) ?(?:tuer|buter|poignarder|planter|egorger|flinguer|descendre|empoisonner|tirer dessus)\b",
        ),
        (
            HO_,
            r"\b(?:vais|veux|jvais) (?:le|la|les|lui) ?(?:tabasser|defoncer|frapper|eclater|niquer)\b",
        ),
        (
            HO,
            r"\b(?:vais|veux|jvais|jure que je vais|va) (?:tuer|buter|poignarder|egorger|flinguer|empoisonner) (?:mon|ma|mes|son|sa|ses|ce mec|cette meuf|tout le monde|tous|toute la classe|le prof|la prof)\b",
        ),
        (HO, r"\bpoignard\w*|\begorg\w*|\bempoisonn\w*"),
        (
            HO,
            r"\b(?:couteau|flingue|fusil|arme|pistolet|lame|machette)\b[^.!?]{0,30}\b(?:lycee|college|ecole|bahut|cours|classe)\b|\b(?:lycee|college|ecole|bahut)\b[^.!?]{0,30}\b(?:couteau|flingue|fusil|pistolet)\b",
        ),
        (
            HO,
            r"\bmettre le feu a (?:sa|leur|la|son) (?:maison|baraque|appart|voiture)\b|\b(?:defoncer|exploser|eclater|fracasser) (?:lui )?le crane\b|\blui tirer dessus\b|\btuer tout le monde\b",
        ),
        (HO, r"\btabasser\b[^.!?]{0,30}\b(?:jusqua|jusqu a)\b"),
        (
            AB,
            r"\b{fam}\b[^.!?]{0,30}?\b(?:me |m ?)(?:frappe|frappent|bat|battent|tape|tapent|etrangle|etranglent|brule|brulent|touche|touchent|tabasse|tabassent|cogne|cognent|enferme|enferment|gifle|giflent|viole|a frappe|a encore frappe|a battu|a viole|a touche|a gifle|a brule|a etrangle|met des (?:claques|baffes|gifles|coups))\b",
        ),
        (
            AB,
            r"\bje me fais (?:taper|frapper|battre|cogner|tabasser) par (?:mon|ma|mes)\b",
        ),
        (
            AB,
            r"\b(?:bleus|marques|traces)\b[^.!?]{0,20}\b(?:parce que|a cause de|de) (?:mon|ma|mes)\b",
        ),
        (AB_, r"\bpeur de rentrer (?:chez moi|a la maison)\b"),
        (
            AB,
            r"\bva (?:encore )?me (?:frapper|taper|battre|tabasser)\b|\bm ?enferment?\b[^.!?]{0,30}\bsans (?:manger|bouffe|nourriture)\b",
        ),
        (
            EXPLICIT,
            r"\bnudes?\b|\bphotos? (?:nue?s?|de moi nue?|en sous[- ]vetements|en culotte|en calecon|torse nu|sexy|hot)\b|\bsous[- ]vetements\b[^.!?]{0,15}\bphoto|\b(?:enlever|retirer) (?:mes|tes|ses) (?:habits|vetements|fringues)\b|\bmature pour (?:mon|ton) age\b|\btorse nu\b[^.!?]{0,20}\bphoto",
        ),
        (
            ASK,
            r"\b(?:demande|demander|veut|voulait|propose|reclame)\w*\b[^.!?]{0,25}\bphotos?\b|\bphotos? de moi\b|\ballumer (?:ma|ta|la) (?:camera|cam|webcam)\b|\b(?:me voir|se voir|me rencontrer|rencontrer) (?:seule?|en prive|seul a seul)\b|\b(?:vienne|venir|aller) chez lui\b|\bpropose de l ?argent\b",
        ),
        (
            ADULT,
            r"\b(?:homme|adulte|monsieur|mec plus (?:age|vieux)|type de \d\d|plus age|plus vieux|\d\d ans|entraineur|coach|prof|vieux)\b",
        ),
        (
            SECRET,
            r"\b(?:pas|rien|jamais) (?:le |en )?dire a (?:mes|ta|tes|ma|personne|mon)\b|\bsans le dire a\b|\b(?:notre|un) secret\b|\beffacer (?:nos|les) (?:messages|convs?|conversations)\b|\bpour que (?:ma|mon|mes) (?:mere|pere|parents|daronne|daron) (?:les |le )?(?:voie|voient|sache|sachent)\b",
        ),
    ],
};

const DE: Lang = Lang {
    code: "de",
    fam: r"(?:mein|meine|meinem|meiner|meinen) (?:vater|mutter|papa|mama|stiefvater|stiefmutter|eltern|onkel|tante|opa|oma|alter|alte)|der (?:freund|typ|mann) (?:von )?meiner (?:mutter|mama)",
    rules: &[
        (
            SH,
            r"\b(?:will|mochte|wurde gern|wurde am liebsten|wunschte ich ware|wunschte ich konnte|wunschte)\b[^.!?]{0,20}\b(?:sterben|tot sein|nicht mehr leben|nicht mehr da sein|nicht mehr aufwachen|nicht mehr existieren)\b",
        ),
        (
            SH,
            r"\bnicht mehr leben (?:will|wollen|mochte)\b|\b(?:keinen bock|keine lust|keine kraft) mehr (?:zu|auf|aufs) (?:leben|lebn)\b|\b(?:mude|satt) vom leben\b|\blebensmude\b",
        ),
        (
            SH,
            r"\b(?:mich|mir) (?:selbst )?(?:umbringen|umzubringen|das leben nehmen)\b|\bbring(?:e)? mich um\b",
        ),
        (
            SH,
            r"\b(?:denke|dachte|denk|gedanken) (?:an|uber) (?:selbstmord|suizid|sterben|den tod|mich umzubringen)\b",
        ),
        (
            SH_,
            r"\b(?:selbstmord|suizid)\w*|\bich kann nicht mehr\b|\bwill (?:einfach )?nicht mehr\s*[.!]*$|\bhalte (?:das|es) nicht mehr aus\b|\bwas soll (?:das alles|ich hier|das leben)(?: noch)?\b",
        ),
        (
            SH,
            r"\b(?:ritze|ritzen|geritzt|ritz)\b|\bmir selbst weh\b|\bverletze mich (?:selbst|absichtlich)\b|\bmich (?:selbst|absichtlich) verletzen\b|\bselbstverletz\w*",
        ),
        (
            SH,
            r"\b(?:niemand|keiner|keine sau)\b[^.!?]{0,10}\b(?:wurde|wird) mich (?:vermissen|vermisst)\b",
        ),
        (
            SH,
            r"\b(?:allen|alle|jeder|jedem|meiner familie|meinen eltern)\b[^.!?]{0,10}\b(?:ginge|ging|ware|waren|geht) (?:es )?(?:besser|viel besser) (?:dran )?ohne mich\b",
        ),
        (SH, r"\bnicht mehr aufwachen\b|\bnie wieder aufwachen\b"),
        (
            SH,
            r"\b(?:ganze packung|alle|viele|zu viele|nen haufen|einen haufen|die ganzen)\b[^.!?]{0,10}\b(?:tabletten|pillen|schlaftabletten)\b[^.!?]{0,15}\b(?:genommen|geschluckt)\b",
        ),
        (
            SH_,
            r"\b(?:spring|springe|springen)\b[^.!?]{0,25}\b(?:von der|von einer|vom) (?:brucke|dach|hochhaus|balkon)\b|\bvor (?:den|einen) zug\b",
        ),
        (
            SH,
            r"\bschluss mit allem\b|\bschluss machen\b[^.!?]{0,10}\b(?:mit allem|fur immer)\b|\ballem ein ende\b",
        ),
        (
            HO,
            r"\bbring(?:e)? (?:ihn|sie|euch|dich|den [a-z]+|die [a-z]+|meinen [a-z]+|meine [a-z]+|alle) um\b",
        ),
        (
            HO,
            r"\b(?:will|werde|werd|wollte)\b[^.!?]{0,30}\b(?:umbringen|toten|abstechen|erstechen|abknallen|erschiessen|vergiften|kaltmachen)\b",
        ),
        (
            HO,
            r"\b(?:stech|steche|stach)\b[^.!?]{0,20}\b(?:ab|nieder)\b|\babstechen\b|\berstechen\b|\b(?:knall|knalle)\b (?:[a-z]+ ){1,2}ab\b|\babknallen\b",
        ),
        (
            HO,
            r"\b(?:messer|waffe|pistole|knarre|gewehr)\b[^.!?]{0,30}\b(?:schule|klasse|unterricht)\b",
        ),
        (
            HO,
            r"\bzund\w*\b[^.!?]{0,30}\b(?:haus|wohnung|auto) an\b|\bvergift\w*|\bschadel ein\b|\bschadel einschlagen\b",
        ),
        (
            HO,
            r"\bschlag(?:e)? (?:ihn|sie) (?:so lange|tot|zusammen|krankenhausreif)\b|\bbis (?:er|sie) nicht mehr (?:laufen|atmen|aufstehen) kann\b",
        ),
        (
            AB,
            r"\b{fam}\b[^.!?]{0,30}?\b(?:schlagt|haut|verhaut|prugelt|verprugelt|wurgt|tritt|verbrennt|fasst|begrapscht|missbraucht|sperrt|sperren|schlagen|hauen|prugeln)\b[^.!?]{0,15}\bmich\b",
        ),
        (
            AB,
            r"\b{fam}\b[^.!?]{0,15}\bmich\b[^.!?]{0,20}\b(?:geschlagen|verprugelt|gewurgt|getreten|verbrannt|angefasst|missbraucht|eingesperrt)\b",
        ),
        (
            AB,
            r"\b(?:werde|wurde|werd)\b[^.!?]{0,30}\bvon (?:meinem|meiner|meinen) (?:vater|mutter|papa|mama|stiefvater|stiefmutter|eltern|onkel)\b[^.!?]{0,20}\b(?:geschlagen|verprugelt|gewurgt|getreten|angefasst|missbraucht|eingesperrt)\b",
        ),
        (
            AB,
            r"\bblaue flecken\b[^.!?]{0,30}\b(?:vater|mutter|papa|mama|stiefvater|eltern|er|sie)\b",
        ),
        (AB_, r"\bangst (?:nach hause|heim) zu (?:gehen|kommen)\b"),
        (
            AB,
            r"\b(?:er|sie)\b (?:schlagt|haut|prugelt) mich (?:wieder|immer|jeden)\b",
        ),
        (
            EXPLICIT,
            r"\bnackt\w*|\bnudes?\b|\bunterwasche\b|\boben ohne\b|\b(?:mich|dich) auszieh\w*|\breif fur (?:mein|dein) alter\b|\bwas ich (?:anhabe|trage)\b",
        ),
        (
            ASK,
            r"\b(?:will|wollte|fragt|fragte|bittet|schickt)\b[^.!?]{0,30}\b(?:bilder|bild|fotos|foto|pics|selfies)\b|\b(?:bilder|fotos) von mir\b|\bkamera an(?:mache|machen)?\b|\ballein treffen\b|\bzu ihm (?:nach hause|in die wohnung)\b|\bgeld fur\b[^.!?]{0,15}\bfotos\b",
        ),
        (
            ADULT,
            r"\b(?:alterer|alteren|erwachsener|erwachsene|mann|\d\d ?jahrig\w*|\d\d jahre|ist so \d\d|trainer|lehrer)\b",
        ),
        (
            SECRET,
            r"\b(?:meinen eltern|meiner mutter|meinem vater|keinem|niemandem)\b[^.!?]{0,10}\bnicht (?:sagen|erzahlen)\b|\bkeinem (?:was )?(?:sage|sagen|erzahle|erzahlen)\b|\bunser geheimnis\b|\bnachrichten losch\w*|\bdamit meine (?:mutter|eltern|mama) (?:sie |es )?nicht (?:sieht|sehen|erfahrt|merkt)\b",
        ),
    ],
};

const JA: Lang = Lang {
    code: "ja",
    fam: r"(?:親|父|母|お父さん|お母さん|おとうさん|おかあさん|パパ|ママ|継父|継母|義父|義母|叔父|伯父|母の彼氏|ママの彼氏|父親|母親)",
    rules: &[
        (
            SH,
            r"死にたい|しにたい|シニタイ|タヒにたい|氏にたい|4にたい|死にた(?:すぎ|く)|消えたい|消えてしまいたい|いなくなりたい|消えてなくなりたい",
        ),
        (
            SH,
            r"自殺(?:しよう|したい|しようと|を考え|するつもり|願望)|リスカ|アムカ|レグカ|自傷|(?:手首|腕)(?:を)?切(?:っ|る|り)|また切っ",
        ),
        (
            SH,
            r"生きて(?:い)?たくない|生きる(?:の|こと)(?:が|に)?(?:疲れ|つかれ)|生きてる意味|生きる意味(?:が)?(?:ない|わからない)|生まれてこなければ",
        ),
        (
            SH,
            r"(?:いなくなっても|死んでも)誰も|いない方が(?:みんな|いい|まし)|起きなければ|目が覚めなければ|目覚めなければ",
        ),
        (
            SH,
            r"飛び降り(?:よう|たい|る)|od(?:し|した|しちゃ|する|しよう)|オーバードーズ|薬(?:を)?(?:いっぱい|たくさん|全部|大量に?)(?:飲ん|のん)|首(?:を)?(?:吊|つ)(?:ろう|りたい|る)|終わりにしたい|死のう|自分を傷つけ",
        ),
        (
            SH_,
            r"楽になりたい|もう無理|生きるのが(?:つらい|辛い|しんどい|めんどくさい)",
        ),
        (
            HO,
            r"(?:^|[^自])殺す|殺してやる|殺したい|ぶっ殺|ぶっころ|刺す|刺してやる|刺したい|刺し殺|毒を(?:入れ|盛)|かち割|ボコボコにしてやる|ぶん殴ってやる|殴り殺",
        ),
        (
            HO,
            r"(?:家|部屋|車|学校)に火を(?:つけ|付け)|放火|(?:ナイフ|包丁|刃物)(?:を)?(?:学校|持って|用意)",
        ),
        (
            AB,
            r"{fam}[^。]{0,15}?(?:殴られ|叩かれ|たたかれ|蹴られ|殴って|叩いて|蹴って|首を絞め|首絞め|触って(?:くる|きた)|押し付け|閉じ込め|虐待)",
        ),
        (
            AB,
            r"(?:また|毎日|いつも)(?:殴られ|叩かれ|蹴られ)|(?:殴られ|叩かれ|蹴られ)[^。]{0,10}あざ|あざだらけ|虐待(?:されて|されてる)",
        ),
        (AB_, r"家に帰るのが怖い|家に帰りたくない"),
        (
            EXPLICIT,
            r"裸|下着|服(?:を)?脱いで|脱いで(?:って|ほしい)|エッチな(?:写真|画像)|大人っぽいね|大人びて",
        ),
        (
            ASK,
            r"(?:写真|画像|自撮り|じどり|顔写真|写メ)(?:を)?(?:送って|ちょうだい|欲しい|ほしい|見せて)|カメラ(?:を)?(?:つけて|オンにして)|(?:二人きり|ふたりきり|2人きり)で会|家に来て|会いたいって|お金あげるから",
        ),
        (
            ADULT,
            r"大人|年上|おじさん|男の人|\d\d歳|コーチ|先生|社会人",
        ),
        (
            SECRET,
            r"(?:親|誰|だれ|お母さん|ママ|家族)(?:に|には|にも)(?:は)?(?:言うな|言わないで|いわないで|内緒|秘密)|秘密|内緒|(?:メッセージ|メッセ|dm|トーク|ライン|line)(?:を)?消して",
        ),
    ],
};

static LANGS: [Lang; 6] = [EN, ES, PT, FR, DE, JA];

/// The sport's slang, hyperbole and third-person or media talk that must not count: masked out of the
/// normalized text before the crisis patterns run.
const MASK: &[&str] = &[
    r"\bsuicide (?:no[ -]?hand(?:er|ed)?s?|air|grab|plant|flip|can[ -]?can|drop|invert|tail ?whip|whip|can)\b",
    r"\bdead ?sailor\b|\bdeath (?:drop|grip|trap|wobbles?|cookie|spiral)\b|\bkiller (?:line|spot|run|park|session|sesh|edit|track|trick|jump|part)\b",
    r"\b(?:id|i would|i could|would|could) (?:die|kill) for\b|\bdying to\b|\bdie (?:of|from) (?:laughter|laughing|embarrassment|cringe|boredom)\b|\b(?:killing|kill|kill some) time\b",
    r"\b(?:kill|murder|slay|destroy|smash|shred|wreck|crush|send)(?:ed|ing|s)? (?:it|(?:this|that|the|these|those|a|an) (?:line|ledge|rail|trick|gap|set|stairs?|spot|park|sesh|session|comp|contest|run|drop|jump|kicker|bowl|ramp|pipe|halfpipe|edit|clip|part|course|track|hill|trail|game|test|exam|ditch|hubba|curb|bank|flip|kickflip|grind|day|wave|level|boss))\b",
    r"\b(?:is|was|looks|be|thats|its) (?:straight |pure |literally |basically )?suicide\b|\bsuicide (?:mission|run|gap|line|drop)\b|\bgonna die (?:on|at|in|from|of|trying)\b|\bshoot(?:ing|s)? (?:him|her|them|me|you|u|us|my [a-z]+) (?:a|an|the|some|my|your|his|her)\b",
    r"\b(?:kill|beat|destroy|smoke|murder|smash)(?:ed|ing|s)? (?:him|her|them|you|me|every ?one) (?:at|in) (?:a |the )?(?:game of )?(?:skate|horse|comp|contest|fortnite|ranked|mario kart|chess|jam|battle|race|game)\b",
    r"\bhit me up\b|\bbeat me (?:at|in|on|by|to)\b|\bcut(?:ting)? (?:class|school|my hair|the grip|grip|weight|the line|my deck|the deck|my board|down|up|out|back|corners?|it close)\b|\bcut (?:myself|my [a-z]+) on (?:the|a|my|some)\b|\b\d+ ?kms?\b|\bsuicide prevention\b|\bhang yourself out\b",
    r"\b(?:morir(?:me|se)?|muero|muere|muerto|muerta|mori|morirme) (?:de|por) (?:risa|hambre|sed|sueno|cansancio|frio|calor|verguenza|ganas|aburrimiento|amor|nervios)\b|\bmatar(?:la|lo)? el tiempo\b|\bmatando el tiempo\b",
    r"\bme pego (?:el|la|los|las) \b|\bpega(?:r|ba|n|ron|o)? (?:un|unos|una|unas) (?:grito|gritos|susto|sustos|bronca|regano|reganos)\b|\bme cort\w* (?:el pelo|el cabello|el fleco|el flequillo|las unas|el dedo|la mano|con (?:la|el|un|una) (?:lija|grip|papel|lata|vidrio))\b|\bprevencion del suicidio\b|\bque se (?:suicida|suicido|mata|mato)\b|\bme voy a matar (?:en|con|de) (?:esa|ese|la|el)\b",
    r"\bmorr(?:i|er|endo|o|emos) de (?:rir|fome|sede|sono|cansaco|vontade|medo|vergonha|frio|calor|tedio|saudade)\b|\bme cort\w* (?:com|na|no) (?:a |o )?(?:lixa|papel|vidro)\b|\bprevencao (?:ao|do) suicidio\b|\bsetembro amarelo\b",
    r"\b(?:mort|morte|morts|mortes) de (?:rire|fatigue|faim|froid|peur)\b|\bmeurs (?:de |d ?)(?:rire|faim|envie|soif|froid)\b|\b(?:mourir|crever) de (?:rire|faim|chaud|soif|froid|envie)\b|\btuer le temps\b|\bfrapp\w* a la porte\b|\bprevention du suicide\b|\bme tuer (?:sur|au|en faisant) |\b(?:qui|il|elle|quil) se suicide\b",
    r"\btot ?lachen\b|\blach mich tot\b|\btodmude\b|\bzeit totschlagen\b|\b(?:beim|im|bei) [a-z]+ (?:geschlagen|besiegt)\b|\bsterbe vor (?:hunger|langeweile|lachen|durst)\b|\b(?:suizid|selbstmord)pravention\b|\b(?:der|die) sich umbringt\b",
    r"死ぬほど|死ぬかと|死ぬ気で|笑い死|死にそう|[^。]{0,10}(?:って|という)(?:歌詞|曲|歌|セリフ|タイトル|映画|アニメ)|自殺予防",
];

/// Laughter and joke markers: a match next to them is less sure (still flagged).
const LAUGH: &str = r"\b(?:lol|lmao|lmfao|ha(?:ha)+h?|ja(?:ja)+|je(?:je)+|k{3,}|rs{2,}|mdr|ptdr|xd+)\b|😂|🤣|💀|😆|笑|w{2,}$";

/// Talk about a song, film or the news: a match there is less sure (still flagged).
const MEDIA: &str = r"\b(?:song|movie|film|lyrics|episode|cancion|peli|pelicula|serie|letra|musica|filme|chanson|lied|news|noticia|noticias)\b|歌詞|映画|ドラマ|アニメ|漫画";

/// A compiled pattern, or a set of them, with the one search cache every thread uses in turn.
struct Pattern {
    re: meta::Regex,
    cache: Mutex<meta::Cache>,
}

impl Pattern {
    /// One pattern as `regex::Regex` compiles it (leftmost-first, UTF-8, a 2 MB lazy DFA), without
    /// capture groups: only where it matches is read.
    fn one(pattern: &str) -> Pattern {
        let config = meta::Config::new()
            .match_kind(MatchKind::LeftmostFirst)
            .utf8_empty(true)
            .which_captures(WhichCaptures::Implicit)
            .nfa_size_limit(Some(10 << 20))
            .hybrid_cache_capacity(2 << 20);
        Pattern::build(&[pattern], config)
    }

    /// A set reporting every pattern that matches (as `regex::RegexSet`), with a lazy DFA of `dfa`
    /// bytes.
    fn set<P: AsRef<str>>(patterns: &[P], dfa: usize) -> Pattern {
        let config = meta::Config::new()
            .match_kind(MatchKind::All)
            .utf8_empty(true)
            .which_captures(WhichCaptures::None)
            .nfa_size_limit(Some(10 << 20))
            .hybrid_cache_capacity(dfa);
        Pattern::build(patterns, config)
    }

    fn build<P: AsRef<str>>(patterns: &[P], config: meta::Config) -> Pattern {
        let re = meta::Builder::new()
            .configure(config)
            .syntax(syntax::Config::new().utf8(true))
            .build_many(patterns)
            .expect("screen patterns compile");
        let cache = Mutex::new(re.create_cache());
        Pattern { re, cache }
    }

    /// The cache, held for one search; made afresh if a search ever panicked holding it.
    fn cache(&self) -> MutexGuard<'_, meta::Cache> {
        self.cache.lock().unwrap_or_else(|poisoned| {
            self.cache.clear_poison();
            let mut cache = poisoned.into_inner();
            cache.reset(&self.re);
            cache
        })
    }

    fn is_match(&self, text: &str) -> bool {
        self.re
            .search_half_with(&mut self.cache(), &Input::new(text).earliest(true))
            .is_some()
    }

    /// The indexes of the set's patterns that match, ascending.
    fn matches(&self, text: &str) -> PatternSet {
        let mut found = PatternSet::new(self.re.pattern_len());
        self.re
            .which_overlapping_matches_with(&mut self.cache(), &Input::new(text), &mut found);
        found
    }

    /// `text` with every match replaced by `with`.
    fn replace_all<'t>(&self, text: &'t str, with: &str) -> Cow<'t, str> {
        let mut cache = self.cache();
        let mut searcher = Searcher::new(Input::new(text));
        let mut next = || searcher.advance(|input| Ok(self.re.search_with(&mut cache, input)));
        let Some(first) = next() else {
            return Cow::Borrowed(text);
        };
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        let mut found = Some(first);
        while let Some(m) = found {
            out.push_str(&text[last..m.start()]);
            out.push_str(with);
            last = m.end();
            found = next();
        }
        out.push_str(&text[last..]);
        Cow::Owned(out)
    }
}

/// The compiled screen: one set of every language's patterns, and what each one means.
struct Screen {
    /// One set per language (small sets keep the lazy DFA's states few), with that language.
    sets: Vec<(Pattern, &'static Lang)>,
    mask: Pattern,
    laugh: Pattern,
    media: Pattern,
}

/// Makes `\b` ASCII-only, so the patterns stay in the fast DFA (text is mostly ASCII once normalized).
fn ascii_bounds(pattern: &str) -> String {
    pattern.replace(r"\b", r"(?-u:\b)")
}

static SCREEN: LazyLock<Screen> = LazyLock::new(|| {
    let sets = LANGS
        .iter()
        .map(|lang| {
            let family = format!("(?:{})", lang.fam);
            let patterns: Vec<String> = lang
                .rules
                .iter()
                .map(|(_, p)| ascii_bounds(&p.replace("{fam}", &family)))
                .collect();
            (Pattern::set(&patterns, 4 << 20), lang)
        })
        .collect();
    let mask = MASK
        .iter()
        .map(|p| format!("(?:{p})"))
        .collect::<Vec<_>>()
        .join("|");
    Screen {
        sets,
        mask: Pattern::one(&ascii_bounds(&mask)),
        laugh: Pattern::one(&ascii_bounds(LAUGH)),
        media: Pattern::one(&ascii_bounds(MEDIA)),
    }
});

/// The ASCII spelling of a Latin letter with a diacritic (and of ß, œ, æ), None for any other char.
fn fold(c: char) -> Option<&'static str> {
    Some(match c {
        'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' => "a",
        'ç' | 'ć' => "c",
        'è' | 'é' | 'ê' | 'ë' => "e",
        'ì' | 'í' | 'î' | 'ï' => "i",
        'ñ' => "n",
        'ò' | 'ó' | 'ô' | 'õ' | 'ö' => "o",
        'ù' | 'ú' | 'û' | 'ü' => "u",
        'ý' | 'ÿ' => "y",
        'ß' => "ss",
        'œ' => "oe",
        'æ' => "ae",
        _ => return None,
    })
}

/// The text the patterns read: lowercase, full-width ASCII made half-width, diacritics folded,
/// apostrophes dropped, curly quotes straightened, runs of 3+ repeated letters collapsed to one, and
/// whitespace collapsed to single spaces.
pub(crate) fn normalize(text: &str) -> String {
    let mut folded = String::with_capacity(text.len());
    let chars = text.chars().map(|c| match c {
        '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
        _ => c,
    });
    for c in chars.flat_map(char::to_lowercase) {
        match c {
            '\'' | '’' | '‘' | '`' | '´' | 'ʼ' => folded.push('\''),
            '“' | '”' | '«' | '»' | '„' => folded.push('"'),
            c if c.is_whitespace() => folded.push(' '),
            c => match fold(c) {
                Some(s) => folded.push_str(s),
                None => folded.push(c),
            },
        }
    }
    let mut out = String::with_capacity(folded.len());
    let mut chars = folded.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            if !chars.peek().is_some_and(|n| "tmslrvd".contains(*n)) {
                out.push(' ');
            }
            continue;
        }
        let mut run = 1;
        while chars.next_if_eq(&c).is_some() {
            run += 1;
        }
        let keep = if c == ' ' || (run >= 3 && c.is_alphabetic()) {
            1
        } else {
            run
        };
        out.extend(std::iter::repeat_n(c, keep));
    }
    out
}

/// The languages whose patterns matched: bit `i` is `LANGS[i]`.
type Langs = u8;

/// The crisis screen of one user message; None when nothing is found.
pub fn screen(text: &str) -> Option<Flag> {
    let s = &*SCREEN;
    let normalized = normalize(text);
    let masked = s.mask.replace_all(&normalized, " | ");
    let mut found = [[0 as Langs; 2]; 4];
    let mut cues = [0 as Langs; 4];
    for (bit, (set, lang)) in s.sets.iter().enumerate() {
        for i in set.matches(&masked).iter() {
            match lang.rules[i.as_usize()].0 {
                Sig::Crisis(c, sure) => found[c as usize][usize::from(sure)] |= 1 << bit,
                Sig::Groom(cue) => cues[cue as usize] |= 1 << bit,
            }
        }
    }
    found[Category::Grooming as usize][1] |= grooming(cues);
    let (category, langs, sure) = [true, false]
        .into_iter()
        .flat_map(|sure| Category::ALL.into_iter().map(move |c| (c, sure)))
        .find_map(|(c, sure)| {
            let langs = found[c as usize][usize::from(sure)];
            (langs != 0).then_some((c, langs, sure))
        })?;
    let joking = s.laugh.is_match(&normalized) || s.media.is_match(&normalized);
    Some(Flag {
        category,
        lang: pick_lang(langs, text).to_string(),
        sure: sure && (category == Category::Grooming || !joking),
    })
}

/// True when the sport's slang or everyday hyperbole was masked out of the message and no crisis word is
/// left ("kill this line", "that slam almost killed me lol"): what a learned layer or the moderation
/// endpoint flags in such a message is the sport talking, not a crisis.
pub(crate) fn only_sport(text: &str) -> bool {
    let normalized = normalize(text);
    let masked = SCREEN.mask.replace_all(&normalized, " | ");
    matches!(masked, Cow::Owned(_)) && !OUTPUT.crisis_context.is_match(&masked)
}

/// The languages in which the grooming cues add up: an explicit request alone, a request for pictures
/// or a meeting from an adult or in secret, or an adult asking for secrecy.
fn grooming([explicit, ask, adult, secret]: [Langs; 4]) -> Langs {
    let mut langs = explicit;
    if ask != 0 && adult | secret != 0 {
        langs |= ask | adult | secret;
    }
    if adult != 0 && secret != 0 {
        langs |= adult | secret;
    }
    langs
}

/// The language to report among those that matched: the message's own when it is one of them.
fn pick_lang(langs: Langs, text: &str) -> &'static str {
    if langs.count_ones() > 1
        && let Some(code) = language(text)
        && let Some(i) = LANGS.iter().position(|l| l.code == code)
        && langs & (1 << i) != 0
    {
        return code;
    }
    LANGS[langs.trailing_zeros() as usize].code
}

/// Words frequent in one language's chat and rare in the other four (function words, slang, and the
/// words crises are said with), on normalized text.
const WORDS: [(&str, &[&str]); 5] = [
    (
        "en",
        &[
            "i", "im", "the", "and", "to", "my", "you", "is", "it", "of", "in", "that", "this",
            "dont", "cant", "want", "with", "for", "just", "at", "he", "she", "they", "what", "be",
            "do", "have", "on", "like", "lol", "gonna", "wanna", "been", "when", "anymore",
            "about", "keeps", "asking", "if", "would", "one", "again", "myself", "your", "idk",
            "bro", "rn", "fr", "tbh", "really", "going", "after", "today", "tomorrow",
        ],
    ),
    (
        "es",
        &[
            "yo", "el", "y", "una", "mi", "mis", "lo", "ya", "pero", "muy", "quiero", "estoy",
            "tengo", "porque", "nadie", "hoy", "voy", "otra", "vez", "cuando", "sin", "jaja",
            "del", "al", "ese", "esa", "eso", "hay", "estuvo", "casi", "tan", "pues", "neta",
            "wey", "bien", "mucho", "nunca", "siempre", "nos", "como", "donde", "tambien", "ahora",
            "solo", "ni", "otro", "dejo", "muerto", "muerta", "padre", "madre", "cuarto", "mata",
            "quiere", "mandas", "primera", "gracias", "aqui", "manana", "con", "estar", "vida",
            "puedo", "los", "las", "volvi", "nuevo", "muero", "llego",
        ],
    ),
    (
        "pt",
        &[
            "eu", "o", "e", "uma", "meu", "minha", "meus", "nao", "pra", "pro", "pros", "com",
            "voce", "vc", "ele", "ela", "ta", "mais", "muito", "quero", "tenho", "ninguem", "vou",
            "mae", "pai", "tudo", "isso", "esse", "essa", "kkk", "k", "hoje", "novo", "sem",
            "quer", "fica", "mano", "cara", "tava", "vai", "em", "pelo", "pela", "tambem", "sim",
            "mim", "comigo", "agora", "ontem", "amanha", "mesmo", "demais", "irado", "quase",
            "depois", "acabado", "tombo", "vdd", "obrigado", "voltei", "medo", "tomei", "morrendo",
            "meio", "filme", "menino", "fiz", "na", "viver", "quando",
        ],
    ),
    (
        "fr",
        &[
            "je", "j", "il", "elle", "les", "et", "des", "mon", "ma", "mes", "ne", "pas", "plus",
            "est", "suis", "qui", "au", "aux", "avec", "pour", "sur", "ce", "cette", "jai", "ai",
            "jsuis", "veux", "mere", "pere", "personne", "tout", "trop", "mdr", "ptdr", "moi",
            "encore", "quand", "parce", "dit", "ans", "chez", "lui", "tue", "tuent", "ca", "on",
            "vu", "du", "nous", "vous", "ont", "fait", "tres", "bien", "quoi", "comme", "aussi",
            "frerot", "envoie", "faim", "chaleur", "lycee", "parle", "maman", "jsp", "jvais",
            "jveux", "t", "as", "temps", "avant",
        ],
    ),
    (
        "de",
        &[
            "ich",
            "du",
            "er",
            "sie",
            "der",
            "die",
            "das",
            "und",
            "nicht",
            "ist",
            "bin",
            "mein",
            "meine",
            "mich",
            "mir",
            "mit",
            "zu",
            "ein",
            "eine",
            "nach",
            "wenn",
            "hab",
            "habe",
            "auch",
            "will",
            "kann",
            "mehr",
            "noch",
            "von",
            "den",
            "dem",
            "sein",
            "ihn",
            "wieder",
            "hat",
            "keiner",
            "niemand",
            "vater",
            "mutter",
            "schule",
            "heute",
            "ohne",
            "krass",
            "krasser",
            "echt",
            "geil",
            "nen",
            "ne",
            "gestanden",
            "am",
            "war",
            "auf",
            "fur",
            "uber",
            "voll",
            "mega",
            "digga",
            "bock",
            "kein",
            "keine",
            "nix",
            "schon",
            "mal",
            "doch",
            "wie",
            "warum",
            "weil",
            "aber",
            "oder",
            "sehr",
            "bist",
        ],
    ),
];

/// Letters (and punctuation) that one or two of the languages write, and how much each says for whom.
fn letter_hint(c: char) -> &'static [(usize, f32)] {
    match c {
        'ñ' | '¿' | '¡' => &[(1, 2.0)],
        'á' | 'í' | 'ó' | 'ú' => &[(1, 0.5), (2, 0.5)],
        'ã' | 'õ' => &[(2, 2.0)],
        'ô' => &[(2, 1.0), (3, 0.3)],
        'â' | 'ê' => &[(2, 0.5), (3, 0.5)],
        'ç' => &[(2, 0.5), (3, 1.0)],
        'é' => &[(1, 0.3), (2, 0.3), (3, 0.5)],
        'è' | 'à' | 'ù' | 'œ' | 'î' | 'û' | 'ë' | 'ï' => &[(3, 1.0)],
        'ä' | 'ö' | 'ü' | 'ß' => &[(4, 2.0)],
        _ => &[],
    }
}

/// Hiragana, katakana or a CJK ideograph.
fn is_japanese(c: char) -> bool {
    matches!(c, '\u{3040}'..='\u{30FF}' | '\u{4E00}'..='\u{9FFF}' | '\u{FF66}'..='\u{FF9F}')
}

/// Best guess of the message's language among the six, None when it cannot tell (used to choose the
/// referral's language; short texts may be None).
pub fn language(text: &str) -> Option<&'static str> {
    if text.chars().any(is_japanese) {
        return Some("ja");
    }
    let mut score = [0f32; 5];
    for c in text.to_lowercase().chars() {
        for &(i, weight) in letter_hint(c) {
            score[i] += weight;
        }
    }
    let normalized = normalize(text);
    for word in normalized.split(|c: char| !c.is_alphanumeric()) {
        for (i, (_, words)) in WORDS.iter().enumerate() {
            if words.contains(&word) {
                score[i] += 1.0;
            }
        }
    }
    let mut order: Vec<usize> = (0..5).collect();
    order.sort_by(|&a, &b| score[b].total_cmp(&score[a]));
    let (first, second) = (score[order[0]], score[order[1]]);
    (first >= 1.0 && first - second >= 0.5).then(|| WORDS[order[0]].0)
}

/// The output check: its masks (supportive negations, slang) and its two kinds of blocked content.
struct Output {
    mask: Pattern,
    sexual: Pattern,
    self_harm: Pattern,
    encourage: Pattern,
    crisis_context: Pattern,
}

static OUTPUT: LazyLock<Output> = LazyLock::new(|| {
    let compile = |p: &str| Pattern::one(&ascii_bounds(p));
    Output {
        mask: compile(
            r"\b(?:dont|do not|never|please dont|please do not|not|no need to|wont|shouldnt|should not|stop) (?:[a-z]+ ){0,2}?(?:kill|hurt|cut|harm|unalive|end) (?:yourself|your life|urself|it)\b|\bhang yourself out\b|\bhook(?:ing|ed)? up with (?:the|your|our|a) (?:crew|squad|team|homies|group|friends|local|shop|sponsor|coach)\b|\bstrip of\b|\bkeep in touch\b|\bno te (?:mates|hagas dano)\b|\bnao se (?:mate|machuque)\b|\bne te (?:tue|fais pas de mal)\b|\btu dir nichts an\b|\b(?:dont|do not|never|wont|not gonna|no need to) (?:ever )?give up\b|\bno te rindas\b|\bnao (?:desista|desiste)\b|\bn abandonne (?:pas|jamais)\b|\bgib (?:nicht|niemals|bloss nicht) auf\b|諦めないで|あきらめないで|諦めるな|あきらめるな",
        ),
        sexual: compile(
            r"\b(?:sex|sexual(?:ly)?|sexy|nudes?|naked|horny|orgasm\w*|porn\w*|boobs|tits|dick|cock|pussy|blow ?job|hand ?job|make out with (?:you|me)|making out|hook(?:ing)? up with (?:you|me)|kiss (?:you|me) (?:all over|everywhere|slowly)|touch (?:you|yourself|me) (?:all over|everywhere|down there)|undress(?:ing)?|take off your (?:clothes|shirt|pants|bra)|in bed with (?:you|me)|turns? me on|sexting|erotic|aroused|lingerie|your body (?:is|looks) (?:hot|sexy)|send me (?:a )?(?:pic|photo|selfie)s? (?:in|without) your)\b|\b(?:sexo|sexual|desnud[oa]s?|porno|tetas|coger|follar|mamada|excitad[oa]|pelad[oa]|transar|tesao|tesuda|foder|punheta|sexe|baiser|bander|excitee?|seins|nichons|ficken|titten|blasen|erregt|nacktbilder?|nacktfotos?|quitate la ropa|tira a roupa|enleve tes vetements|zieh dich aus)\b|セックス|エッチ|えっち|裸|おっぱい|脱いで|抱きたい|ヤりたい|やらせて",
        ),
        self_harm: compile(
            r"\b(?:kill yourself|kys|unalive yourself|end your (?:own )?life|take your (?:own )?life|slit (?:your|ur) wrists?|cut (?:deeper|your wrists?|vertically)|(?:lethal|fatal|deadly|overdose) (?:dose|amount)|how many (?:pills|tablets)\b[^.!?]{0,30}\b(?:die|kill|overdose|od|lethal)|how to (?:tie a noose|hang yourself|kill yourself|overdose|commit suicide)|tie a noose|jump off a bridge|take (?:all|every one|the rest) (?:of )?(?:your|ur|the|those) (?:pills|meds|tablets|pillz|sleeping pills)|(?:no ?one|nobody) (?:would|will|is going to|is gonna) (?:even )?(?:care|miss you|notice)|(?:everyone|they|your family|the world)(?:d| would| will)? be better off without you|you (?:should|deserve to|might as well) die)\b|\b(?:matate|suicidate|deberias (?:matarte|suicidarte|morirte)|nadie te (?:extranaria|echaria de menos|va a extranar)|vai se matar|(?:devia|deveria|devias) se matar|(?:tu devrais|tu dois) (?:te tuer|mourir|en finir)|du solltest (?:dich umbringen|sterben)|se mata logo|ninguem (?:sentiria|vai sentir) (?:sua|tua) falta|tue[- ]toi|suicide[- ]toi|personne ne te (?:regretterait|manquerait)|bring dich (?:doch )?um|tote dich|niemand wurde dich vermissen)\b|死ね|しね|消えろ|死んだほうがいい|死ねばいい|自殺しなよ|死ぬべき",
        ),
        encourage: compile(
            r"\b(?:you should|u should|go ahead and|just|why dont you|maybe you should|you might as well|you could) (?:do it|end it(?: all)?|go through with it|stop existing|give up on life|disappear)\b|\b(?:hazlo|hacelo|faz isso|fais[- ]le|tu es)\b|\b(?:give up|rindete|rendete|desiste|desista|abandonne|laisse tomber|gib (?:es |einfach |doch )?auf)\b|諦めろ|あきらめろ|やっちゃえ|やればいい",
        ),
        crisis_context: compile(
            r"\b(?:die|dying|death|dead|suicide|suicidal|kill|pills|end it|alive|better off|nobody|no one|cut|cutting|life|morir|muerte|suicid\w*|morrer|mourir|sterben|vida|vie|leben|nobody cares|no one cares|nadie|ninguem|personne|niemand|pastillas|pilulas|comprimidos|cachets|tabletten|medikamente)\b|死|自殺|誰も|薬",
        ),
    }
});

/// Whether a companion message speaks of death, harm, pills or giving up (what self-harm encouragement
/// is about), as the output check reads it.
pub(crate) fn harm_context(text: &str) -> bool {
    let o = &*OUTPUT;
    let normalized = normalize(text);
    let masked = o.mask.replace_all(&normalized, " | ");
    o.crisis_context.is_match(&masked) || o.encourage.is_match(&masked)
}

/// The output check of a companion message: sexual content (blocked for everyone: these are sports
/// companions) or self-harm encouragement/instructions (methods, doses, "you should do it", "nobody
/// would care"), None when it may go out.
pub fn check_output(text: &str) -> Option<Blocked> {
    let o = &*OUTPUT;
    let normalized = normalize(text);
    let masked = o.mask.replace_all(&normalized, " | ");
    if o.self_harm.is_match(&masked)
        || (o.encourage.is_match(&masked) && o.crisis_context.is_match(&masked))
    {
        return Some(Blocked::SelfHarm);
    }
    o.sexual.is_match(&masked).then_some(Blocked::Sexual)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sport's slang and everyday hyperbole: none of it is a crisis.
    const SLANG: &[&str] = &[
        "kill this line",
        "that slam almost killed me",
        "i'm dead 😂",
        "suicide no-hander",
        "just landed my first suicide no hander over the hip",
        "send it",
        "my mom's gonna kill me",
        "this ledge is killing me",
        "killed it",
        "dying to try the new park",
        "me muero de risa",
        "je suis mort de rire",
        "死ぬほど疲れた",
        "shoot a line",
        "shoot a photo",
        "hit the rail",
        "slam",
        "wreck",
        "my legs are dead",
        "i'd die for a sesh at burnside",
        "the kicker killed my ankle",
        "suicide air",
        "hang yourself out there",
        "dead sailor",
        "that death drop is gnarly",
        "killer line",
        "that was sick",
        "bro that was ill",
        "gnarly bail",
        "hippie jump",
        "that gap is suicide lol",
        "gonna shoot him a text",
        "i'm gonna kill him at skate tomorrow",
        "i cut my leg on the pegs",
        "my dad hit me up about the sesh",
        "my brother beat me at skate again",
        "mi mamá me va a matar si llego tarde",
        "mi mamá me pegó el resfriado",
        "esse tombo quase me matou kkk",
        "meu pai bateu o carro mas ta todo mundo bem",
        "ce rail me tue",
        "mon père a frappé à la porte",
        "ich lach mich tot",
        "die hitze bringt mich um",
        "mein bruder hat mich beim tischtennis geschlagen",
        "遅刻したらお母さんに殺される",
        "映画で主人公が自殺するシーンが悲しかった",
    ];

    /// Crisis messages of the labelled set's tune split: two per category per language.
    const TUNE: &[(&str, &str, Category)] = &[
        (
            "en",
            "honestly thinking about kms tonight",
            Category::SelfHarm,
        ),
        ("en", "relapsed on sh last night 😞", Category::SelfHarm),
        ("en", "i'm gonna poison her drink", Category::HarmOthers),
        (
            "en",
            "ill stab anyone who talks to me at school tomorrow",
            Category::HarmOthers,
        ),
        (
            "en",
            "my parents lock me in my room with no food for days",
            Category::Abuse,
        ),
        (
            "en",
            "my stepmom burns me with her cigarettes",
            Category::Abuse,
        ),
        (
            "en",
            "some 30 year old keeps dming me saying im mature for my age and wants to meet up alone",
            Category::Grooming,
        ),
        (
            "en",
            "an adult on snap told me to delete our messages so my mom wont see",
            Category::Grooming,
        ),
        ("es", "estoy pensando en suicidarme", Category::SelfHarm),
        ("es", "me volví a cortar los brazos 😔", Category::SelfHarm),
        (
            "es",
            "mañana llevo una navaja a la escuela y lo apuñalo",
            Category::HarmOthers,
        ),
        (
            "es",
            "los voy a matar a todos en el insti",
            Category::HarmOthers,
        ),
        (
            "es",
            "mi papá me golpea cuando está borracho",
            Category::Abuse,
        ),
        (
            "es",
            "el novio de mi mamá me ahorca cuando se enoja",
            Category::Abuse,
        ),
        (
            "es",
            "un señor en insta me pide fotos y dice que no le diga a mis papás",
            Category::Grooming,
        ),
        (
            "es",
            "un tipo mayor de discord quiere que le mande nudes",
            Category::Grooming,
        ),
        ("pt", "quero morrer", Category::SelfHarm),
        (
            "pt",
            "ninguém sentiria minha falta se eu sumisse",
            Category::SelfHarm,
        ),
        (
            "pt",
            "vou matar meu padrasto já peguei a faca",
            Category::HarmOthers,
        ),
        (
            "pt",
            "vou tacar fogo na casa dele hoje",
            Category::HarmOthers,
        ),
        ("pt", "minha mãe me bate", Category::Abuse),
        ("pt", "apanho do meu pai todo dia", Category::Abuse),
        (
            "pt",
            "ele tem uns 28 anos e fica pedindo pack",
            Category::Grooming,
        ),
        (
            "pt",
            "um homem pede pra eu ligar a câmera e tirar a roupa",
            Category::Grooming,
        ),
        ("fr", "je veux mourir", Category::SelfHarm),
        ("fr", "jsuis fatigué de vivre", Category::SelfHarm),
        (
            "fr",
            "demain j'amène un couteau au lycée et je le poignarde",
            Category::HarmOthers,
        ),
        (
            "fr",
            "je jure que je vais le buter quand je le vois",
            Category::HarmOthers,
        ),
        ("fr", "ma mère me frappe", Category::Abuse),
        (
            "fr",
            "je me fais taper par mon père tous les jours",
            Category::Abuse,
        ),
        (
            "fr",
            "un mec plus âgé sur discord veut que je lui envoie des nudes",
            Category::Grooming,
        ),
        (
            "fr",
            "un homme me demande d'allumer ma caméra et d'enlever mes habits",
            Category::Grooming,
        ),
        ("de", "ich will sterben", Category::SelfHarm),
        ("de", "ich hab mich wieder geritzt", Category::SelfHarm),
        (
            "de",
            "ich knall den typen ab ich mein das ernst",
            Category::HarmOthers,
        ),
        (
            "de",
            "ich will alle in meiner klasse umbringen",
            Category::HarmOthers,
        ),
        (
            "de",
            "mein vater schlägt mich wenn er betrunken ist",
            Category::Abuse,
        ),
        (
            "de",
            "ich werde jeden tag von meinem vater verprügelt",
            Category::Abuse,
        ),
        (
            "de",
            "ein 30 jähriger schreibt mir ich sei so reif für mein alter und will mich allein treffen",
            Category::Grooming,
        ),
        (
            "de",
            "mein trainer wollte fotos von mir in unterwäsche",
            Category::Grooming,
        ),
        ("ja", "消えたい", Category::SelfHarm),
        ("ja", "自殺しようと思ってる", Category::SelfHarm),
        (
            "ja",
            "明日学校にナイフ持ってってあいつ刺す",
            Category::HarmOthers,
        ),
        ("ja", "会ったら絶対殺す", Category::HarmOthers),
        ("ja", "お母さんに叩かれる", Category::Abuse),
        ("ja", "毎日親に殴られてる", Category::Abuse),
        (
            "ja",
            "ディスコードの年上の人が裸の写真送ってって",
            Category::Grooming,
        ),
        (
            "ja",
            "年上の男の人が家に来てって、誰にも言わないでって",
            Category::Grooming,
        ),
    ];

    #[test]
    fn slang_and_hyperbole_are_not_a_crisis() {
        for text in SLANG {
            assert_eq!(screen(text), None, "{text}");
        }
    }

    #[test]
    fn tune_examples_get_their_category_and_language() {
        for &(lang, text, category) in TUNE {
            let flag = screen(text).unwrap_or_else(|| panic!("missed: {text}"));
            assert_eq!(flag.category, category, "{text}");
            assert_eq!(flag.lang, lang, "{text}");
        }
        for category in Category::ALL {
            for lang in ["en", "es", "pt", "fr", "de", "ja"] {
                let n = TUNE
                    .iter()
                    .filter(|t| t.0 == lang && t.2 == category)
                    .count();
                assert!(n >= 2, "{lang} {category:?}");
            }
        }
    }

    #[test]
    fn unsure_when_joking_or_talking_about_a_song() {
        let flag = screen("i wanna die lol").expect("flagged");
        assert!(!flag.sure);
        assert!(screen("i want to die").expect("flagged").sure);
    }

    #[test]
    fn normalization_folds_accents_repeats_and_width() {
        assert_eq!(normalize("Mátame   YAAAA"), "matame ya");
        assert_eq!(normalize("ＯＤしちゃった"), "odしちゃった");
        assert_eq!(normalize("I’m dyinggg"), "im dying");
        assert_eq!(normalize("d’allumer"), "d allumer");
        assert_eq!(
            screen("i want to dieeee").map(|f| f.category),
            Some(Category::SelfHarm)
        );
    }

    #[test]
    fn language_guesses() {
        assert_eq!(language("i don't want to be here anymore"), Some("en"));
        assert_eq!(language("¿por qué nadie me entiende?"), Some("es"));
        assert_eq!(
            language("não aguento mais, ninguém liga pra mim"),
            Some("pt")
        );
        assert_eq!(language("je suis fatigué de tout"), Some("fr"));
        assert_eq!(language("ich kann nicht mehr"), Some("de"));
        assert_eq!(language("死にたい"), Some("ja"));
        assert_eq!(language("ok"), None);
    }

    #[test]
    fn output_check_lets_sports_talk_and_support_through() {
        for text in [
            "that's a sick line",
            "kill it tomorrow",
            "ride it out",
            "hook up with the crew",
            "i'm really glad you told me. please reach out to someone you trust or call 988",
            "please don't hurt yourself. you matter, and i'm here. can you call 988 right now?",
            "you should do it tomorrow, that kicker is perfect for a 360",
            "hang yourself out there on the lip and commit",
            "echt geil, der kickflip!",
            "ce spot est mortel",
            "¡mañana lo matas!",
            "hit me up when you're at the park",
        ] {
            assert_eq!(check_output(text), None, "{text}");
        }
    }

    #[test]
    fn output_check_blocks_sexual_content_and_self_harm_encouragement() {
        for (text, blocked) in [
            ("i want to kiss you all over", Blocked::Sexual),
            ("send me nudes", Blocked::Sexual),
            ("you look so sexy in that pic", Blocked::Sexual),
            ("quítate la ropa", Blocked::Sexual),
            ("you should do it, nobody would care", Blocked::SelfHarm),
            ("honestly just kill yourself", Blocked::SelfHarm),
            ("take 20 pills, that's a lethal dose", Blocked::SelfHarm),
            ("nobody would miss you anyway", Blocked::SelfHarm),
            ("hazte un favor y mátate", Blocked::SelfHarm),
            ("tu devrais te tuer", Blocked::SelfHarm),
            ("bring dich doch um", Blocked::SelfHarm),
            ("死ねばいい", Blocked::SelfHarm),
        ] {
            assert_eq!(check_output(text), Some(blocked), "{text}");
        }
    }

    /// Threads screening at once take turns with each pattern's cache and get what one thread alone
    /// gets.
    #[test]
    fn threads_screening_at_once_get_what_one_thread_gets() {
        let texts: Vec<&str> = SLANG
            .iter()
            .copied()
            .chain(TUNE.iter().map(|t| t.1))
            .collect();
        let alone: Vec<_> = texts.iter().map(|t| (screen(t), check_output(t))).collect();
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..20)
                            .flat_map(|_| texts.iter().map(|t| (screen(t), check_output(t))))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for thread in threads {
                let got = thread.join().expect("no panic");
                for (i, r) in got.into_iter().enumerate() {
                    assert_eq!(r, alone[i % texts.len()], "{}", texts[i % texts.len()]);
                }
            }
        });
    }
}
