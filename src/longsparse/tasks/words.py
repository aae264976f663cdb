"""Word lists for needle keys: ``adjective-noun`` pairs, as RULER draws its word keys.

RULER takes its adjectives and nouns from the ``wonderwords`` package; these shorter lists are our own, chosen to be
plain, unambiguous English that does not occur hyphenated in the public-domain haystacks (KJV, Shakespeare).
The lists give about 39,000 distinct keys.
"""

from __future__ import annotations

ADJECTIVES: tuple[str, ...] = tuple(
    """
    able acidic active agile amber ancient angry awkward bashful bitter blank bold bouncy brave breezy bright brisk
    broken bumpy busy calm careful cheap cheerful chilly classic clever cloudy clumsy coastal cold colossal cosmic
    cozy crisp crooked crowded cuddly curious curly damp dapper dazzling decent delicate dense dizzy dreamy dusty
    eager early electric elegant empty endless exotic faint famous fancy fierce filthy flaky flat fluffy foggy
    formal fragile frantic frozen funny fuzzy gentle giant gigantic glossy golden graceful grumpy hairy handy hasty
    heavy helpful hidden hollow humble hungry icy idle jolly jumpy juicy lazy leafy legal little lively lonely
    loud lucky magic massive mellow messy mighty minor misty modern muddy narrow nervous nimble noisy odd orange
    polite proud purple quick quiet rapid rare rough round royal rusty salty sandy scary shaggy shiny silent silly
    sleepy slimy smooth snowy soggy solid sour spicy spotty steady sticky stormy sturdy sunny sweet swift tame tidy
    tiny tricky ugly upbeat vague vivid wacky warm wavy wild windy wise witty wooden zesty
    """.split()
)

NOUNS: tuple[str, ...] = tuple(
    """
    acorn airport album anchor ankle apron armchair attic avocado backpack bagel balcony ballet balloon banjo
    barrel basket battery beacon beaver bicycle biscuit blanket blender blossom bookcase bottle boulder bracelet
    broccoli bucket buffalo butter button cabbage cabinet cactus camera canal candle canoe canyon caravan carpet
    carrot castle catalog cathedral cello chimney chocolate cinema circus clarinet cliff closet cobweb coconut
    comet compass cookie corridor cottage coyote crayon cricket crocodile cupboard curtain cushion cyclone dentist
    desert diamond dinosaur dolphin doorbell dragonfly drawer drum eagle easel elbow elevator engine envelope
    eraser falcon faucet feather ferry fiddle flamingo flashlight flute fountain freezer frog galaxy garage
    garden garlic gazelle geyser giraffe glacier glove goblet gorilla guitar hammock hamster harbor harmonica
    hedgehog helmet highway hippo hoodie hurricane igloo iguana jacket jaguar jellyfish jigsaw kangaroo kayak
    kettle keyboard kitten koala ladder laptop lantern lemon leopard library lighthouse lizard llama lobster
    locker magnet mailbox mango marble meadow microwave mitten monkey mosquito motorcycle muffin mushroom
    napkin necklace noodle notebook octopus orchard ostrich otter oven paddle pancake panther parrot peacock
    pebble pelican penguin pepper piano pickle pillow pineapple pirate pistachio planet pocket popcorn potato
    pretzel pumpkin puppet puzzle quilt rabbit raccoon radio raincoat raven robot rocket saddle sailboat
    sandwich saxophone scarf scooter seashell skateboard snowman spaceship squirrel stapler submarine suitcase
    sunflower teapot telescope tiger toaster tomato tornado tortoise tractor trampoline trombone trumpet tulip
    turtle umbrella unicorn vacuum violin volcano waffle walrus wardrobe whistle windmill yacht zebra zeppelin
    """.split()
)
